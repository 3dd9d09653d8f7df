"""GGUF tensor names (llama.cpp's) -> the Hugging Face names our model's loader asks for."""

from __future__ import annotations

import re

# llama.cpp's per-block tensor names; the HF side is the module path under model.layers.N.
_BLOCK = {
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
}
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Precomputed tables llama.cpp adds for its own kernels; the config carries what they encode
# (llama3 rope scaling), so they are skipped rather than reported as unexpected.
SKIPPED = frozenset({"rope_freqs.weight"})
# llama.cpp's converter interleaves the rows of each head of these for its rope kernel (llama
# architecture only); HF models expect the halves layout, so the rows are put back at load.
ROPE_PERMUTED = {"attn_q": "head_count", "attn_k": "head_count_kv"}

_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_GLOBAL_RE = re.compile(r"(\w+)\.(weight|bias)")


class GgufNameError(ValueError):
    pass


def hf_name(gguf_name: str) -> str:
    """The HF name of a GGUF tensor; a tensor we have no place for is an error naming it."""
    if m := _BLOCK_RE.fullmatch(gguf_name):
        layer, kind, suffix = m.groups()
        if kind in _BLOCK:
            return f"model.layers.{layer}.{_BLOCK[kind]}.{suffix}"
    elif (m := _GLOBAL_RE.fullmatch(gguf_name)) and m.group(1) in _GLOBAL:
        return f"{_GLOBAL[m.group(1)]}.{m.group(2)}"
    raise GgufNameError(f"GGUF tensor {gguf_name!r} has no counterpart in the served model")


def rope_head_count_key(gguf_name: str) -> str | None:
    """For a Q/K projection of a llama GGUF: the metadata key holding its number of heads."""
    m = _BLOCK_RE.fullmatch(gguf_name)
    return ROPE_PERMUTED.get(m.group(2)) if m else None
