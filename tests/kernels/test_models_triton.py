"""Whole models of the new architectures with the Triton attention backend (compiled on a GPU,
interpreted on a CPU) against transformers: soft-capped scores in the prefill and decode
kernels (Gemma 2), a replicated KV head with q/k norms and per-type ropes (Gemma 3), partial
longrope (Phi-3), post norms and whole-projection q/k norms (OLMo 3), a layer without
position encoding (EXAONE 4), windows shorter than the prompts in every sliding layer, the fused MoE
kernel (Qwen2-MoE; ungated experts, Nemotron 3), attention sinks and biased experts (gpt-oss),
latent attention (DeepSeek-V3)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE

from launcher.tiny_models import build_model
from shard.distributed import Distributed
from shard.models import load_model
from tests.shard.paged_helpers import assert_every_step_equals_reference, reference, run_paged
from tests.shard.tiny_model_cases import MOE_MODELS, NEW_ARCH_MODELS

# the kernels' tiling is tests/kernels' other tests': here one tile where the models allow
# (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("whole_model_tiles")
STEPS = 3
# The kernels' head sizes start at 64 (tests/kernels/kernel_cases.py HEAD_DIMS): two heads of
# 64 over a hidden size of 128, otherwise each case's own overrides.
SHAPE = {"hidden_size": 128, "num_attention_heads": 2, "head_dim": 64}
ALIBI_HEADS = {"hidden_size": 192, "num_attention_heads": 3, "num_key_value_heads": 3}
CASES = {
    "gemma2_softcap_alternating": {"num_key_value_heads": 1, "query_pre_attn_scalar": 48},
    "gemma3_qk_norm_local_rope": {"num_key_value_heads": 1},
    "phi3_partial_longrope": {"num_key_value_heads": 2},
    # post norms only with q/k normed over the whole projection, a window and its own rope
    # base in the first layer (OLMo 3); a layer without position encoding (EXAONE 4)
    "olmo3_sliding_one_kv_head": {},
    "exaone4_sliding_nope": {"num_key_value_heads": 1},
    # the fused MoE kernel (shard/platforms/cuda/kernels/fused_moe.py) in a whole model: top-3
    # of 8 experts, the shared expert, a dense layer between two sparse ones
    "qwen2_moe_shared_dense": {"num_key_value_heads": 1},
    # gpt-oss as released: attention sinks in both kernels, windows of 7 in every other layer,
    # the fused MoE kernel with expert biases and the clamped SwiGLU over MXFP4 experts
    # dequantized at load
    "gpt_oss_mxfp4": {"num_key_value_heads": 1},
    # DeepSeek's latent attention: both kernels over one cached 64-wide latent (32 + 32
    # rotary dims) that every query head reads
    "deepseek_v3_mla": {},
    # DeepSeek-V3.2 past its 12-token top_k: the decode kernel over each token's chosen rows
    # (blocks of one slot), which also hold the indexer's keys, the queries padded with zeros
    # against them (within top_k, the dense kernels: tests/shard/test_sparse_attention.py)
    "deepseek_v32_sparse_attention": {},
    # Mistral Large 4: the same past top_k over layers with and without rotary dims (a NoPE
    # layer's rows are the latent and the indexer key alone), queries scaled by position
    "mistral_large4_sparse_nope": {},
    # Gemma 4: global layers of 128-dim heads (values their keys, one KV head) beside 64-dim
    # sliding ones; experts beside the dense MLP. And the small models' per-layer embeddings
    # and layers attending over earlier layers' caches.
    "gemma4_experts_beside_dense": {},
    "gemma4_per_layer_inputs_kv_sharing": {"num_key_value_heads": 1},
    # Gemma 3n: its layers' attention (KV sharing, windows) in both kernels, over its streams
    "gemma3n_altup_laurel_sparse": {"num_key_value_heads": 1},
    # Llama 4: chunks of 8 positions in both kernels (prompts cross several); the fused MoE
    # kernel on inputs weighted by the router, one choice each
    "llama4_chunked_nope_top1": {"num_key_value_heads": 1},
    # Granite 4.0-H: the kernels' attention layer between Mamba layers, whose state pools sit in
    # the same cache list
    "granite4_hybrid_dense_nope": {"num_key_value_heads": 1},
    # GPT-2: its Conv1D weights transposed at load, the kernels without rotary
    "gpt2_conv1d": {"n_embd": 128, "n_head": 2},
    # OPT: the kernels without rotary, learned positions two rows into their table
    "opt_learned_positions": {"word_embed_proj_dim": 128},  # the embedding as wide
    # ALiBi in both kernels: three heads of 64 (BLOOM's slopes for a count that is not a power
    # of two; MPT's clamped q/k/v and softmax_scale)
    "bloom_alibi_six_heads": ALIBI_HEADS,
    "mpt_alibi_clip_scale": ALIBI_HEADS,
    # Falcon-H1: the kernels' attention beside a Mamba 2 mixer in every layer
    "falcon_h1_parallel_hybrid": {"num_key_value_heads": 1},
    # LFM3: the kernels' sliding and full layers (proportional rope), each head's output gated
    "lfm3_gated_sliding_sandwich": {"num_key_value_heads": 1},
    # Laguna: the kernels over each layer's own number of query heads (2, 4, 1, 3 on one KV
    # head), windows of 7 and half-rotated heads, softplus gates; the fused MoE kernel
    "laguna_head_counts_softcapped": {
        "num_key_value_heads": 1,
        "num_attention_heads_per_layer": [2, 4, 1, 3],
    },  # fmt: skip
    # MiMo-V2-Flash: the kernels over values zero-padded to the keys' width, sinks in the
    # sliding layers only, two KV heads there and one in the full layer
    "mimo_v2_flash_narrow_values": {"head_dim": 48, "v_head_dim": 32},  # (192 and 128 released)
    # Mellum 2: the kernels' sliding and full layers (each its rope base) with q/k norms
    "mellum_sliding_dense_first": {"num_key_value_heads": 1},
    # LFM2: the kernels' attention layer (per-head q/k norms) between short convolutions
    "lfm2_short_conv_hybrid": {"num_key_value_heads": 1},
    # StarCoder: the kernels' multi-query attention (one KV head for both query heads) without
    # rotary, positions learned and added to the tokens
    "gpt_bigcode_multi_query": {},
    # Falcon-40B's layers: both query heads in one KV group of the fused q/k/v, attention and
    # the MLP in parallel
    "falcon_grouped_two_norms": {"num_kv_heads": 1},
    # Nemotron 3: the fused MoE kernel's ungated experts (relu^2 of the up tile alone) beside
    # Mamba 2 and attention layers
    "nemotron3_ungated_experts": {"num_key_value_heads": 1},
    # Jamba: the kernels' attention without rotary between Mamba 1 mixers, the fused MoE
    # kernel's unrenormalised softmax choices
    "jamba_mamba1_attention_experts": {"num_key_value_heads": 1},
}
# Phi-3's longrope factors, one per rotated frequency: 64 * 0.75 / 2 of them at this head size
FREQUENCIES = 24


def _longrope(rope: dict) -> dict:
    return {
        **rope,
        "short_factor": [1.0 + i / 48 for i in range(FREQUENCIES)],
        "long_factor": [2.0 + i / 4 for i in range(FREQUENCIES)],
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    built = {}
    for name, extra in CASES.items():
        architecture, overrides = {**NEW_ARCH_MODELS, **MOE_MODELS}[name]
        overrides = {**overrides, **SHAPE, **extra}
        if architecture in ("Phi3ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"):
            # Phi-3's head size is hidden / heads, never configured; DeepSeek's head_dim is
            # its rotary width
            overrides.pop("head_dim")
            overrides["rope_parameters"] = _longrope(overrides["rope_parameters"])
        if architecture in ("FalconForCausalLM", "MistralLarge4ForConditionalGeneration"):
            # head_dim is hidden / heads (Mistral Large 4's: its rotary width), not configured
            overrides.pop("head_dim")
        built[name] = build_model(tmp_path_factory.mktemp(name), architecture, **overrides)
    return built


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_ids_and_logits_equal_transformers(checkpoints, name):
    path = checkpoints[name]
    ours = load_model(
        path, dtype=torch.float32, device=DEVICE, dist=Distributed(), attention="triton"
    )
    ref = reference(path)
    gen = torch.Generator().manual_seed(2)
    batch = [torch.randint(3, ours.vocab_size, (n,), generator=gen) for n in (21, 37)]
    logits, tokens = run_paged(ours, [p.to(DEVICE) for p in batch], STEPS, seed=4)
    assert_every_step_equals_reference(ref, batch, logits, tokens, atol=1e-4)
