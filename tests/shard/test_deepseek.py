"""DeepSeek's (and GLM-4.7-Flash's) pieces beyond the whole-model comparisons
(test_models_vs_transformers.py, test_tensor_parallel.py, test_chunked_prefill.py,
test_cpu_decode.py): V2's router against
transformers' own module, the latent cache's size, each config value the latent attention reads
changing the model as transformers computes it, configs refused by field."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from paged_helpers import assert_every_step_equals_reference, run_paged
from transformers import AutoModelForCausalLM, DeepseekV2Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

from launcher.tiny_models import build_model
from shard.distributed import Distributed
from shard.layers.moe import route
from shard.models import load_model
from shard.models.config import UnsupportedArchitectureError
from tests.shard.tiny_model_cases import MOE_MODELS

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "experts, method, groups, top_groups, top_k, scale",
    [(8, "greedy", 1, 1, 2, 1.0), (16, "group_limited_greedy", 4, 2, 4, 2.0),
     (12, "group_limited_greedy", 3, 1, 3, 16.0), (16, "greedy", 8, 3, 6, 1.5)],
)  # fmt: skip
def test_v2_router_equals_transformers(experts, method, groups, top_groups, top_k, scale):
    config = DeepseekV2Config(
        hidden_size=32, n_routed_experts=experts, topk_method=method, n_group=groups,
        topk_group=top_groups, num_experts_per_tok=top_k, routed_scaling_factor=scale,
    )  # fmt: skip
    router = DeepseekV2TopkRouter(config)
    gen = torch.Generator().manual_seed(experts + groups)
    with torch.no_grad():
        router.weight.normal_(0.0, 0.3, generator=gen)
    x = torch.randn(40, 32, generator=gen)
    logits, want_weights, want_ids = router(x)
    grouped = method == "group_limited_greedy"
    weights, ids = route(
        logits,
        top_k,
        renormalize=False,
        round_to=None,
        num_groups=groups if grouped else 1,
        top_groups=top_groups,
        scale=scale,
    )
    # the same experts (in any order) with the same weights
    order, want_order = ids.sort(dim=1).indices, want_ids.sort(dim=1).indices
    assert torch.equal(ids.gather(1, order).long(), want_ids.gather(1, want_order))
    torch.testing.assert_close(weights.gather(1, order), want_weights.gather(1, want_order))


@pytest.mark.parametrize("name", ["deepseek_v3_mla", "deepseek_v2_grouped"])
def test_the_cache_holds_one_latent_vector_a_token(tiny_model, name):
    """kv_lora_rank + qk_rope_head_dim values a token and layer (twice: the kernels' key and
    value halves), not the expanded heads' keys and values."""
    model = load_model(tiny_model(name), dtype=torch.bfloat16, device=CPU, dist=Distributed())
    config = json.loads((tiny_model(name) / "config.json").read_text())
    width = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    caches = model.allocate_kv_cache(3, 16)
    assert [c.shape for c in caches] == [(2, 3, 16, 1, width)] * config["num_hidden_layers"]
    assert model.kv_cache_bytes_per_token() == config["num_hidden_layers"] * 2 * width * 2
    heads = config["num_attention_heads"]
    expanded = 2 * heads * (config["qk_nope_head_dim"] + config["qk_rope_head_dim"])
    assert 2 * width < expanded


# Each value changed alone: transformers' logits move by more than 1e-2 (so a server ignoring it
# fails the comparisons) and ours still equal transformers'.
VARIANTS = [
    ("deepseek_v3_mla", {"rope_interleave": False}),
    ("deepseek_v3_mla", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    ("deepseek_v3_mla", {"q_lora_rank": None}),
    ("deepseek_v3_mla", {"kv_lora_rank": 48}),
    ("deepseek_v2_grouped", {"topk_method": "greedy"}),
    ("deepseek_v2_grouped", {"routed_scaling_factor": 1.0}),
    ("deepseek_v2_grouped", {"v_head_dim": 8}),
    ("glm4_moe_lite_mla", {"mlp_layer_types": ["dense", "sparse", "sparse"]}),
]


@pytest.mark.parametrize("name, change", VARIANTS)
def test_each_config_value_is_served_as_transformers_computes_it(
    tiny_model, tmp_path, name, change
):
    architecture, overrides = MOE_MODELS[name]
    path = build_model(tmp_path, architecture, **{**overrides, **change})
    ours = load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model(name), dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(2)
    batch = [torch.randint(3, ours.vocab_size, (n,), generator=gen) for n in (21, 37)]
    with torch.inference_mode():
        moved = (ref(batch[1][None]).logits - base(batch[1][None]).logits).abs().max().item()
    assert moved > 1e-2
    logits, tokens = run_paged(ours, batch, 3, seed=4)
    assert_every_step_equals_reference(ref, batch, logits, tokens, atol=1e-4)


@pytest.mark.parametrize(
    "name, change, field",
    [
        ("deepseek_v2_grouped", {"topk_method": "noaux_tc"}, "topk_method"),
        ("deepseek_v2_grouped", {"norm_topk_prob": True}, "norm_topk_prob"),
        ("deepseek_v2_grouped", {"n_group": 3}, "n_group"),  # 8 experts in 3 groups
        ("deepseek_v3_mla", {"qk_rope_head_dim": 7}, "qk_rope_head_dim"),
        ("deepseek_v3_mla", {"head_dim": 16}, "head_dim"),  # the rotary's 8 dims are tabulated
        ("deepseek_v3_mla", {"topk_group": 5}, "topk_group"),
        ("deepseek_v3_mla", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ("glm4_moe_lite_mla", {"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types"),
    ],
)
def test_configs_it_cannot_serve_are_refused_naming_the_field(
    tiny_model, tmp_path, name, change, field
):
    dst = tmp_path / "bad"
    shutil.copytree(tiny_model(name), dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(UnsupportedArchitectureError, match=field):
        load_model(dst, dtype=torch.float32, device=CPU, dist=Distributed())
