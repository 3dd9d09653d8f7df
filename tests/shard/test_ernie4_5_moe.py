"""ERNIE 4.5 MoE's pieces beyond the whole-model comparisons (test_models_vs_transformers.py,
test_tensor_parallel.py; its MTP modules skipped: test_glm4_moe.py): its router against
transformers' own module, configs refused by field."""

from __future__ import annotations

import pytest
import torch
from config_edits import assert_refused
from transformers import Ernie4_5_MoeConfig
from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeTopKRouter

from shard.layers.moe import route

CPU = torch.device("cpu")
NAME = "ernie4_5_moe_biased_choice"


@pytest.mark.parametrize("experts, top_k, norm_min", [(8, 2, 1e-12), (16, 6, 1e-12), (6, 3, 0.5)])
def test_router_equals_transformers(experts, top_k, norm_min):
    config = Ernie4_5_MoeConfig(
        hidden_size=32, moe_num_experts=experts, moe_k=top_k, moe_norm_min=norm_min
    )
    router = Ernie4_5_MoeTopKRouter(config)
    gen = torch.Generator().manual_seed(experts + top_k)
    with torch.no_grad():
        router.weight.normal_(0.0, 0.3, generator=gen)
        router.moe_statics.e_score_correction_bias.normal_(0.0, 0.1, generator=gen)
    x = torch.randn(40, 32, generator=gen)
    logits, want_weights, want_ids = router(x)
    weights, ids = route(
        logits,
        top_k,
        renormalize=True,
        round_to=None,
        correction_bias=router.moe_statics.e_score_correction_bias.reshape(-1),
        renormalize_min=norm_min,
    )
    order, want_order = ids.sort(dim=1).indices, want_ids.sort(dim=1).indices
    assert torch.equal(ids.gather(1, order).long(), want_ids.gather(1, want_order))
    torch.testing.assert_close(weights.gather(1, order), want_weights.gather(1, want_order))
    # the bias moves the choice: without it, other experts
    unbiased = route(logits, top_k, renormalize=True, round_to=None)[1]
    assert not torch.equal(unbiased.sort(dim=1).values, ids.sort(dim=1).values)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"use_bias": True}, "use_bias"),
        ({"moe_k": 9}, "moe_k"),
        ({"moe_layer_interval": 0}, "moe_layer_interval"),
    ],
)
def test_configs_it_cannot_serve_are_refused_naming_the_field(tiny_model, tmp_path, change, field):
    assert_refused(tiny_model(NAME), tmp_path / "bad", change, field)
