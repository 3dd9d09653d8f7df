"""Our paged models (every served architecture) against transformers on the same tiny checkpoints
(float32)."""

from __future__ import annotations

import re

import pytest
import torch
from paged_helpers import PagedLayout, reference, run_paged

from shard.distributed import Distributed
from shard.models import load_model
from tests.shard.tiny_model_cases import (
    MOE_MODELS,
    NEW_ARCH_MODELS,
    TINY_MODELS,
    VISION_LANGUAGE_MODELS,
)

CPU = torch.device("cpu")
STEPS = 5
ATOL = 1e-4


def prompts(vocab_size: int, lens=(21, 37), seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (n,), generator=gen) for n in lens]


@torch.inference_mode()
def ref_logits(ref: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return ref(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize(
    "name",
    [n for n in TINY_MODELS if n != "llama_odd_vocab"]
    + [*NEW_ARCH_MODELS, *MOE_MODELS, *VISION_LANGUAGE_MODELS],
)
def test_prefill_and_decode_logits_and_greedy_tokens(tiny_model, name):
    path = tiny_model(name)
    ours = load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())
    ref = reference(path)
    batch = prompts(ours.vocab_size)
    logits, tokens = run_paged(ours, batch, STEPS, seed=7)

    start = 0
    for prompt in batch:  # prefill: every prompt position, not just the last
        expected = ref_logits(ref, prompt.tolist())
        torch.testing.assert_close(
            logits[0][start : start + len(prompt)], expected, atol=ATOL, rtol=0
        )
        start += len(prompt)
    for step in range(1, STEPS + 1):
        for row, (prompt, seq) in enumerate(zip(batch, tokens, strict=True)):
            expected = ref_logits(ref, seq[: len(prompt) + step])[-1]
            torch.testing.assert_close(
                logits[step][row], expected, atol=ATOL, rtol=0, msg=f"step {step}"
            )

    for prompt, seq in zip(batch, tokens, strict=True):
        with torch.inference_mode():
            out = ref.generate(
                prompt[None],
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=STEPS + 1,
                do_sample=False,
                pad_token_id=0,
            )
        generated = out[0, len(prompt) :].tolist()
        assert generated, "transformers generated nothing"
        assert seq[len(prompt) : len(prompt) + len(generated)] == generated


def test_prefill_after_cached_prefix(tiny_model):
    """A chunked prompt: the second prefill reads the first chunk's K/V through the block table."""
    path = tiny_model("llama_gqa_llama3")
    ours = load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())
    ref = reference(path)
    a, b, c = prompts(ours.vocab_size, lens=(37, 21, 5), seed=3)
    layout = PagedLayout(16, num_blocks=9, seed=5)
    seq_a, seq_b, seq_c = layout.add(37), layout.add(21), layout.add(5)
    caches = ours.allocate_kv_cache(9, 16)
    with torch.inference_mode():
        positions, meta = layout.prefill([seq_a, seq_b], [0, 0], [16, 21])
        ours(torch.cat([a[:16], b]), positions, caches, meta)
        positions, meta = layout.prefill([seq_a, seq_c], [16, 0], [37, 5])
        logits = ours.compute_logits(ours(torch.cat([a[16:], c]), positions, caches, meta))
    torch.testing.assert_close(logits[:21], ref_logits(ref, a.tolist())[16:], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[21:], ref_logits(ref, c.tolist()), atol=ATOL, rtol=0)


# The parameters a model keeps in float32 whatever the dtype, as transformers computes them:
# OLMo 2's norms (float32 throughout), GLM-4.5's and DeepSeek's routers.
KEPT_FLOAT32 = {
    "olmo2_projection_qk_norm": r"norm\b",
    "glm4_moe_grouped": r"\.router$",
    "deepseek_v3_mla": r"\.router$",
    "glm4_moe_lite_mla": r"\.router$",
    "deepseek_v32_sparse_attention": r"\.router$",
    "kolibri_logit_bias_router": r"\.router$",
    "mimo_v2_flash_narrow_values": r"\.router$",  # DeepSeek-V3's router, as transformers keeps it
    "mistral_large4_sparse_nope": r"\.router$",  # Mistral 4's router in float32
    "flint_sinks_sigmoid": r"norm\b|\.router$",  # gpt-oss's float32 norms too
    "ernie4_5_moe_biased_choice": r"\.router$",
    # NemotronH's block norms scale in float32 (Fp32RMSNorm), its router is DeepSeek-V3's
    "nemotron3_ungated_experts": r"^(layers\.\d+\.)?norm\.weight$|\.router$",
    "cohere2_sliding_nope": r"norm\b",  # Cohere's LayerNorms scale in float32
    "flex_olmo_post_norms": r"norm\b",  # OLMo 2's
    # OLMo 2's norms in the softmax layers, and the linear layers' (not the gated one's, which
    # rounds to the dtype before its weight, as Qwen3.5's)
    "olmo_hybrid_delta_post_norm": r"(?<!linear_attn\.)norm(_weight)?\b",
    # Lara's norms scale in float32, the gated output norm's too; its router scores in float32
    "lara_mini_single_in_proj": r"norm(_weight)?\b|\.router$",
    # KDA's routers are DeepSeek-V3's (its gated norm's weight, dt_bias, A_log and Ling's convs
    # are float32 buffers, not parameters)
    "kimi_linear_kda_nope_mla": r"\.router$",
    "bailing_hybrid_kda_gated_mla": r"\.router$",
    # Gemma 4's norms scale in float32 (the router's and the values' weightless ones too)
    "gemma4_experts_beside_dense": r"norm",
    "gemma4_per_layer_inputs_kv_sharing": r"norm",
    "gemma3n_altup_laurel_sparse": r"norm",
    # Llama 4's q/k L2 norms (weightless: ones in float32)
    "llama4_chunked_nope_top1": r"qk_norm",
    # StableLM 2 12B's per-head q/k LayerNorms (their weights stacked in float32)
    "stablelm2_parallel_qk_layernorm": r"qk_norm\.[qk]_norm\.weight",
}
# Models whose transformers' own half-precision logits are beyond 3e-2 of float32's (OLMo 2's
# post norms: 0.039 in bf16 on these prompts; DeepSeek-V3's case: 0.031; MiniMax-M2's, whose
# router logits are in bf16 and flip an expert choice: 0.25): compared with that error instead.
HALF_AS_TRANSFORMERS = (
    "olmo2_projection_qk_norm",
    "flex_olmo_post_norms",  # OLMo 2's post norms again: 0.066 in bf16
    "deepseek_v3_mla",
    "deepseek_v32_sparse_attention",  # V3's case with the indexer: 0.031 in bf16 too
    "minimax_m2_projection_norms",
    # Gemma 4's per-layer embeddings gate every layer's stream: transformers' bf16 is 0.30 off
    "gemma4_per_layer_inputs_kv_sharing",
    # Gemma 4's router reads the stream in half precision and flips an expert choice: 0.65
    "gemma4_experts_beside_dense",
    # Gemma 3n's sparse MLPs cut their gates at a quantile half precision moves: transformers'
    # fp16 is 0.098 off, its bf16 0.74
    "gemma3n_altup_laurel_sparse",
    # LFM2-MoE's router scores logits computed in bf16, and flips an expert choice: 0.39
    "lfm2_moe_expert_bias",
    # Kolibri's choice by logit plus bias flips under bf16's rounding of the stream: 0.83
    "kolibri_logit_bias_router",
    # OLMo-Hybrid's OLMo 2 post norms and Lara's float32-scaled norms over bf16 delta rules:
    # transformers' bf16 is 0.058 and 0.048 off
    "olmo_hybrid_delta_post_norm",
    "lara_mini_single_in_proj",
    # Mistral Large 4's indexer choice moves under bf16's rounding: transformers' bf16 is 0.37 off
    "mistral_large4_sparse_nope",
    # Jamba's four bf16 layers (its Mamba mixers' normed dt, B and C; the experts): 0.032
    "jamba_mamba1_attention_experts",
    # Kimi Linear's KDA and experts in bf16: 0.039; Ling's rounds each forget gate's log decay
    # to bf16 (as transformers' BailingHybridForgetGate returns it): 0.42 (ours within 0.03 of
    # transformers' bf16 logits in both)
    "kimi_linear_kda_nope_mla",
    "bailing_hybrid_kda_gated_mla",
)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "name",
    [
        "qwen2_bias",
        "qwen2_moe_shared_dense",
        "minimax_m2_projection_norms",
        "olmoe_projection_norms",
        # LayerNorms in the dtype (torch's kernel), gelu_new op by op, the head's bias; 1 + w
        # added in the dtype; weightless norms in float32 and q/k/v clamped
        "phi_qk_layernorm_tied",
        "nemotron_layernorm1p_relu2",
        "olmo_weightless_norms_clip",
        "lfm2_moe_expert_bias",  # sigmoid scores of logits in the dtype, a float32 bias
        # Falcon-H1's in_proj scaled in float32 (its ssm_multipliers), the gated norm's weight
        "falcon_h1_gate_before_norm",
        "mamba2_pure",  # the stream between the blocks in float32
        # Mamba 1's likewise, its scan in float32 from the dtype's projections; Jamba's
        # mixers beside attention and experts
        "falcon_mamba_bcdt_norms",
        "jamba_mamba1_attention_experts",
        *KEPT_FLOAT32,
    ],  # fmt: skip
)
def test_half_precision_tracks_float32(tiny_model, dtype, name):
    path = tiny_model(name)
    ours = load_model(path, dtype=dtype, device=CPU, dist=Distributed())
    kept = {n for n, p in ours.named_parameters() if p.dtype != dtype}
    pattern = KEPT_FLOAT32.get(name)
    assert kept == {n for n, _ in ours.named_parameters() if pattern and re.search(pattern, n)}
    assert all(p.dtype == torch.float32 for n, p in ours.named_parameters() if n in kept)
    # the paged caches (a hybrid's recurrent layers keep states of their own kind)
    paged = [c for c in ours.allocate_kv_cache(2, 16) if isinstance(c, torch.Tensor)]
    # (a pure Mamba model has none: every layer keeps a state)
    assert (paged or ours.recurrent) and all(c.dtype == dtype for c in paged)
    ref = reference(path)
    batch = prompts(ours.vocab_size)
    logits, _ = run_paged(ours, batch, steps=2)
    assert logits[0].dtype == torch.float32
    expected = ref_logits(ref, batch[0].tolist())
    got = logits[0][: len(batch[0])]
    if name in HALF_AS_TRANSFORMERS:
        # transformers' own half-precision run of this model is off float32's by as much as
        # the bound below: ours may be as far as 1.5x its error, not more
        with torch.inference_mode():
            half = reference(path, dtype)
            own = (half(batch[0][None]).logits[0].float() - expected).abs().max().item()
        assert (got - expected).abs().max().item() <= 1.5 * own
        return
    # Half precision rounds every activation; the logits must still be close to float32's.
    torch.testing.assert_close(got, expected, atol=3e-2, rtol=0)
