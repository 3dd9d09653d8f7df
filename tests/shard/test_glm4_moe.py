"""GLM-4.5's Mixture-of-Experts pieces beyond the whole-model comparisons (test_models_vs_
transformers.py, test_tensor_parallel.py): its router against transformers' own module, the
multi-token-prediction layers of the released checkpoints skipped, configs refused by field."""

from __future__ import annotations

import json

import pytest
import torch
from config_edits import assert_refused
from paged_helpers import run_paged
from transformers import Glm4MoeConfig
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

from shard.distributed import Distributed
from shard.layers.moe import route_grouped_sigmoid
from shard.models import load_model
from tests.shard.test_model_loading import copy_with_tensors

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "experts, groups, top_groups, top_k, renormalize, scale",
    [(8, 1, 1, 2, True, 1.0), (16, 4, 2, 4, True, 2.5), (12, 3, 1, 3, False, 1.8),
     (16, 8, 3, 5, True, 1.0)],
)  # fmt: skip
def test_router_equals_transformers(experts, groups, top_groups, top_k, renormalize, scale):
    config = Glm4MoeConfig(
        hidden_size=32, n_routed_experts=experts, n_group=groups, topk_group=top_groups,
        num_experts_per_tok=top_k, norm_topk_prob=renormalize, routed_scaling_factor=scale,
    )  # fmt: skip
    router = Glm4MoeTopkRouter(config)
    gen = torch.Generator().manual_seed(experts + groups)
    with torch.no_grad():
        router.weight.normal_(0.0, 0.3, generator=gen)
        router.e_score_correction_bias.normal_(0.0, 0.2, generator=gen)
    x = torch.randn(40, 32, generator=gen)
    logits, want_weights, want_ids = router(x)
    weights, ids = route_grouped_sigmoid(
        logits,
        top_k,
        correction_bias=router.e_score_correction_bias,
        num_groups=groups,
        top_groups=top_groups,
        renormalize=renormalize,
        scale=scale,
    )
    # the same experts (in any order) with the same weights
    order, want_order = ids.sort(dim=1).indices, want_ids.sort(dim=1).indices
    assert torch.equal(ids.gather(1, order).long(), want_ids.gather(1, want_order))
    torch.testing.assert_close(weights.gather(1, order), want_weights.gather(1, want_order))


# GLM-4.5's and DeepSeek-V3's releases store the MTP layer as one more layer (its own norms and
# projection too); ERNIE 4.5's as modules of its own
AFTER_THE_LAST = ("model.layers.{layers}.eh_proj.weight", "model.layers.{layers}.enorm.weight",
                  "model.layers.{layers}.self_attn.q_proj.weight")  # fmt: skip
ERNIE_MTP = ("model.mtp_block.0.self_attn.q_proj.weight", "model.mtp_emb_norm.0.weight")


@pytest.mark.parametrize(
    "name, mtp",
    [("glm4_moe_grouped", AFTER_THE_LAST), ("deepseek_v3_mla", AFTER_THE_LAST),
     ("glm4_moe_lite_mla", AFTER_THE_LAST), ("ernie4_5_moe_biased_choice", ERNIE_MTP),
     ("minimax_m2_projection_norms", AFTER_THE_LAST)],
)  # fmt: skip
def test_multi_token_prediction_layers_are_skipped(tiny_model, tmp_path, name, mtp):
    source = tiny_model(name)
    layers = json.loads((source / "config.json").read_text())["num_hidden_layers"]

    def add_mtp(tensors: dict) -> None:
        for tensor in mtp:
            tensors[tensor.format(layers=layers)] = torch.ones(4, 4)

    copy_with_tensors(source, tmp_path / "mtp", add_mtp)
    plain = load_model(source, dtype=torch.float32, device=CPU, dist=Distributed())
    with_mtp = load_model(tmp_path / "mtp", dtype=torch.float32, device=CPU, dist=Distributed())
    assert len(with_mtp.layers) == layers
    prompt = [torch.arange(3, 24)]
    want_logits, want_tokens = run_paged(plain, prompt, 2)
    logits, tokens = run_paged(with_mtp, prompt, 2)
    assert tokens == want_tokens
    assert all(torch.equal(a, b) for a, b in zip(logits, want_logits, strict=True))


@pytest.mark.parametrize(
    "change, field",
    [
        ({"n_group": 3}, "n_group"),  # 8 experts in 3 groups
        ({"topk_group": 5}, "topk_group"),
        ({"num_experts_per_tok": 5, "topk_group": 1}, "num_experts_per_tok"),  # 1 group of 2
        ({"n_group": 8, "topk_group": 4, "num_experts_per_tok": 2}, "n_group"),  # 1 per group
    ],
)
def test_configs_the_router_cannot_serve_are_refused_naming_the_field(
    tiny_model, tmp_path, change, field
):
    assert_refused(tiny_model("glm4_moe_grouped"), tmp_path / "bad", change, field)
