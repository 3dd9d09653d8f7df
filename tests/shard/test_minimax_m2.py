"""MiniMax-M2's pieces beyond the whole-model comparisons (test_models_vs_transformers.py,
test_tensor_parallel.py, test_cpu_decode.py; its MTP layers skipped: test_glm4_moe.py): its
router against transformers' own module, transformers' stacked layout read as the Hub's, the
release's config fields transformers does not read refused where they name another model."""

from __future__ import annotations

import shutil

import pytest
import torch
from config_edits import assert_refused, with_config
from paged_helpers import run_paged
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import MiniMaxM2Config
from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2TopKRouter

from launcher.tiny_models import build_model
from shard.distributed import Distributed
from shard.layers.moe import route_grouped_sigmoid
from shard.models import load_model
from tests.shard.tiny_model_cases import MOE_MODELS

CPU = torch.device("cpu")
NAME = "minimax_m2_projection_norms"
PROMPTS = [torch.arange(5, 26), torch.arange(40, 77) * 3 % 500]


@pytest.mark.parametrize("experts, top_k", [(8, 2), (16, 8), (6, 1)])
def test_router_equals_transformers(experts, top_k):
    config = MiniMaxM2Config(hidden_size=32, num_local_experts=experts, num_experts_per_tok=top_k)
    router = MiniMaxM2TopKRouter(config)
    gen = torch.Generator().manual_seed(experts + top_k)
    with torch.no_grad():
        router.weight.normal_(0.0, 0.3, generator=gen)
    bias = torch.randn(experts, generator=gen) * 0.2
    x = torch.randn(40, 32, generator=gen)
    logits, want_weights, want_ids = router(x, bias)
    weights, ids = route_grouped_sigmoid(
        logits, top_k, correction_bias=bias, num_groups=1, top_groups=1, renormalize=True,
        scale=1.0,
    )  # fmt: skip
    order, want_order = ids.sort(dim=1).indices, want_ids.sort(dim=1).indices
    assert torch.equal(ids.gather(1, order).long(), want_ids.gather(1, want_order))
    torch.testing.assert_close(weights.gather(1, order), want_weights.gather(1, want_order))


def test_transformers_stacked_layout_equals_the_hubs(tmp_path):
    architecture, overrides = MOE_MODELS[NAME]
    hub = build_model(tmp_path / "hub", architecture, **overrides)
    stacked = build_model(tmp_path / "stacked", architecture, stacked_experts=True, **overrides)
    with safe_open(stacked / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert {"model.layers.0.mlp.experts.gate_up_proj",
            "model.layers.0.mlp.e_score_correction_bias"} <= names  # fmt: skip
    got, want = (
        run_paged(load_model(p, dtype=torch.float32, device=CPU, dist=Distributed()), PROMPTS, 2)
        for p in (stacked, hub)
    )
    assert got[1] == want[1]
    for a, b in zip(got[0], want[0], strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


# The Hub's names -> a quantization tool's split experts under `mlp` (gptqmodel's defuser writes
# Mixtral's so: tests/quant_fixtures/gptq_g32_sym_mixtral)
SPLIT_UNDER_MLP = {".block_sparse_moe.gate.": ".mlp.gate.",
                   ".block_sparse_moe.e_score_correction_bias": ".mlp.e_score_correction_bias",
                   ".w1.": ".gate_proj.", ".w3.": ".up_proj.", ".w2.": ".down_proj.",
                   ".block_sparse_moe.experts.": ".mlp.experts."}  # fmt: skip


def test_experts_split_under_mlp_equal_the_hubs(tmp_path):
    """The same weights under `mlp.experts.{e}.gate_proj` ..., `mlp.gate` and
    `mlp.e_score_correction_bias`, as a quantization tool saves transformers 5's split experts."""
    architecture, overrides = MOE_MODELS[NAME]
    hub = build_model(tmp_path / "hub", architecture, **overrides)
    split = tmp_path / "split"
    shutil.copytree(hub, split)
    tensors = {}
    for key, value in load_file(hub / "model.safetensors").items():
        for old, new in SPLIT_UNDER_MLP.items():
            key = key.replace(old, new)
        tensors[key] = value
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in tensors
    save_file(tensors, split / "model.safetensors", metadata={"format": "pt"})
    got, want = (
        run_paged(load_model(p, dtype=torch.float32, device=CPU, dist=Distributed()), PROMPTS, 2)
        for p in (split, hub)
    )
    assert got[1] == want[1]
    for a, b in zip(got[0], want[0], strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"scoring_func": "softmax"}, "scoring_func"),
        ({"qk_norm_type": "per_head"}, "qk_norm_type"),
        ({"use_routing_bias": False}, "use_routing_bias"),
    ],
)
def test_release_fields_naming_another_model_are_refused(tiny_model, tmp_path, change, field):
    assert_refused(tiny_model(NAME), tmp_path / "bad", change, field)
    # the release's own values are served
    release = {"scoring_func": "sigmoid", "qk_norm_type": "per_layer", "use_routing_bias": True}
    path = with_config(tiny_model(NAME), tmp_path / "release", release)
    load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())
