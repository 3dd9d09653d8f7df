"""GGUF tensor names (llama.cpp's) -> the Hugging Face names our model's loader asks for, per
GGUF architecture: the same llama.cpp name means different modules in different families
(`ffn_norm` is Llama's post-attention norm, Gemma's pre-feedforward one)."""

from __future__ import annotations

import re

# llama.cpp's per-block tensor names; the HF side is the module path under model.layers.N.
_LLAMA_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # Mixtral's files say `llama`: its router (and experts, _EXPERTS) carry Mixtral's HF names.
    "ffn_gate_inp": "block_sparse_moe.gate",
}
# Gemma 2 and 3: four norms a layer (llama.cpp's post_attention_norm is the norm after
# attention, its ffn_norm the one before the MLP).
_GEMMA_BLOCK = {
    **_LLAMA_BLOCK,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Phi-3: the fused projections keep their fused HF names (llama.cpp calls gate_up_proj ffn_up).
_PHI3_BLOCK = {
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}
# Qwen2-MoE and Qwen3-MoE: the router, the shared expert and its sigmoid gate (Qwen2-MoE); the
# experts themselves are stacked tensors (EXPERTS), read expert by expert.
_QWEN_MOE_BLOCK = {
    **_LLAMA_BLOCK,
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_BLOCKS = {
    "gemma2": _GEMMA_BLOCK,
    "gemma3": _GEMMA_BLOCK,
    "phi3": _PHI3_BLOCK,
    "qwen2moe": _QWEN_MOE_BLOCK,
    "qwen3moe": _QWEN_MOE_BLOCK,
}
# llama.cpp stacks every expert's projection in one [E, rows, cols] tensor; the loader reads the
# Hub's per-expert names, so each stacked tensor stands for E of them (GgufSource).
_QWEN_EXPERTS = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}
_EXPERTS = {
    "llama": (
        "block_sparse_moe",
        {"ffn_gate_exps": "w1", "ffn_up_exps": "w3", "ffn_down_exps": "w2"},
    ),
    "qwen2moe": ("mlp", _QWEN_EXPERTS),
    "qwen3moe": ("mlp", _QWEN_EXPERTS),
}
# A vector in the file that HF holds as one row ([H] -> [1, H]): Qwen2-MoE's shared-expert gate.
ONE_ROW = frozenset({"ffn_gate_inp_shexp"})
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Precomputed tables llama.cpp adds for its own kernels; the config carries what they encode
# (llama3 rope scaling; Phi-3's longrope factors, read into the config by shard/gguf/config.py),
# so they are skipped rather than reported as unexpected.
SKIPPED = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})
# llama.cpp's converter interleaves the rows of each head of these for its rope kernel (llama
# architecture only); HF models expect the halves layout, so the rows are put back at load.
ROPE_PERMUTED = {"attn_q": "head_count", "attn_k": "head_count_kv"}
# Architectures whose converter stores RMSNorm weights as 1 + w (Gemma computes x * (1 + w)):
# the HF weight is the stored one minus 1.
NORM_PLUS_ONE = frozenset({"gemma2", "gemma3"})

_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Mixtral files converted before llama.cpp stacked experts (early 2024) keep one tensor per
# expert: blk.L.ffn_gate.E.weight.
_LEGACY_EXPERT_RE = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight")
_LEGACY_MIXTRAL = {"gate": "w1", "up": "w3", "down": "w2"}
_GLOBAL_RE = re.compile(r"(\w+)\.(weight|bias)")


class GgufNameError(ValueError):
    pass


def hf_name(gguf_name: str, arch: str = "llama") -> str:
    """The HF name of a GGUF tensor of architecture `arch`; a tensor we have no place for is an
    error naming it."""
    if arch == "llama" and (m := _LEGACY_EXPERT_RE.fullmatch(gguf_name)):
        layer, projection, expert = m.groups()
        return (
            f"model.layers.{layer}.block_sparse_moe.experts.{expert}."
            f"{_LEGACY_MIXTRAL[projection]}.weight"
        )
    if m := _BLOCK_RE.fullmatch(gguf_name):
        layer, kind, suffix = m.groups()
        block = _BLOCKS.get(arch, _LLAMA_BLOCK)
        if kind in block:
            return f"model.layers.{layer}.{block[kind]}.{suffix}"
    elif (m := _GLOBAL_RE.fullmatch(gguf_name)) and m.group(1) in _GLOBAL:
        return f"{_GLOBAL[m.group(1)]}.{m.group(2)}"
    raise GgufNameError(f"GGUF tensor {gguf_name!r} has no counterpart in the served model")


def expert_names(gguf_name: str, experts: int, arch: str = "llama") -> list[str] | None:
    """The per-expert HF names a stacked expert tensor of a GGUF of `arch` stands for, expert e
    at index e; None for any other tensor."""
    m = _BLOCK_RE.fullmatch(gguf_name)
    block, projections = _EXPERTS.get(arch, _EXPERTS["llama"])
    if m is None or m.group(2) not in projections:
        return None
    layer, kind, suffix = m.groups()
    module = f"model.layers.{layer}.{block}.experts.{{e}}.{projections[kind]}.{suffix}"
    return [module.format(e=e) for e in range(experts)]


def one_row(gguf_name: str) -> bool:
    """Whether the file's vector is a one-row matrix in HF (ONE_ROW)."""
    m = _BLOCK_RE.fullmatch(gguf_name)
    return m is not None and m.group(2) in ONE_ROW


def rope_head_count_key(gguf_name: str) -> str | None:
    """For a Q/K projection of a llama GGUF: the metadata key holding its number of heads."""
    m = _BLOCK_RE.fullmatch(gguf_name)
    return ROPE_PERMUTED.get(m.group(2)) if m else None


def stored_plus_one(arch: str, hf: str) -> bool:
    """Whether the stored tensor `hf` of a GGUF of `arch` is its HF weight plus one."""
    return arch in NORM_PLUS_ONE and hf.endswith("norm.weight")
