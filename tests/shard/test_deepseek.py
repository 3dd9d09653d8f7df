"""DeepSeek's (and GLM-4.7-Flash's) pieces beyond the whole-model comparisons
(test_models_vs_transformers.py, test_tensor_parallel.py, test_chunked_prefill.py,
test_cpu_decode.py): V2's router against
transformers' own module, the latent cache's size, each config value the latent attention reads
changing the model as transformers computes it, configs refused by field."""

from __future__ import annotations

import json

import pytest
import torch
from config_edits import assert_refused
from paged_helpers import assert_every_step_equals_reference, run_paged
from transformers import AutoModelForCausalLM, DeepseekV2Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

from launcher.tiny_models import build_model
from shard.distributed import Distributed
from shard.layers.moe import route
from shard.models import load_model
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
    """kv_lora_rank + qk_rope_head_dim values a token and layer, stored once (the kernels read
    the one plane as keys and as values), not the expanded heads' keys and values."""
    model = load_model(tiny_model(name), dtype=torch.bfloat16, device=CPU, dist=Distributed())
    config = json.loads((tiny_model(name) / "config.json").read_text())
    width, layers = config["kv_lora_rank"] + config["qk_rope_head_dim"], config["num_hidden_layers"]
    caches = model.allocate_kv_cache(3, 16)
    assert [c.shape for c in caches] == [(2, 3, 16, 1, width)] * layers
    assert all(c.untyped_storage().nbytes() == 3 * 16 * width * 2 for c in caches)
    assert all(c[0].data_ptr() == c[1].data_ptr() for c in caches)
    assert model.kv_cache_bytes_per_token() == layers * width * 2
    heads = config["num_attention_heads"]
    expanded = 2 * heads * (config["qk_nope_head_dim"] + config["qk_rope_head_dim"])
    assert width < expanded


def test_a_plain_attention_cache_keeps_keys_and_values_apart(tiny_model):
    model = load_model(tiny_model("mistral_mqa"), dtype=torch.bfloat16, device=CPU,
                       dist=Distributed())  # fmt: skip
    (cache, *_) = model.allocate_kv_cache(3, 16)
    assert cache.is_contiguous() and cache[0].data_ptr() != cache[1].data_ptr()
    per_token = 2 * model.num_kv_heads * model.head_dim * 2
    assert cache.untyped_storage().nbytes() == 3 * 16 * per_token
    assert model.kv_cache_bytes_per_token() == model.num_layers * per_token


def test_a_one_plane_cache_through_compile_equals_eager(tmp_path, monkeypatch):
    """--compile on latent attention (layers all dense: --compile refuses experts): the graph
    writes the cache's one plane, never its stride-0 two-plane view. AOTAutograd's
    functionalization is what refuses a self-overlapping input it must write, so inductor's
    code generation (a minute here) is left out: backend aot_eager."""
    import functools

    from shard.attention import get_attention_backend
    from shard.platforms.cpu import compiled

    path = build_model(tmp_path / "dense_mla", "DeepseekV3ForCausalLM", num_hidden_layers=2,
                       first_k_dense_replace=2)  # fmt: skip
    model = load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())
    assert model.values_are_keys
    prompts = [torch.arange(3, 12), torch.arange(5, 9)]
    want_logits, want = run_paged(model, prompts, 4)
    monkeypatch.setattr(compiled.torch, "compile",
                        functools.partial(torch.compile, backend="aot_eager"))  # fmt: skip
    forward = compiled.CompiledForward(model, get_attention_backend("torch"))
    try:
        got_logits, got = run_paged(model, prompts, 4, decode_forward=forward)
    finally:
        torch._dynamo.reset()  # no aot_eager graph left for a later test's --compile
    assert got == want
    for a, b in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


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
    assert_refused(tiny_model(name), tmp_path / "bad", change, field)
