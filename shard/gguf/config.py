"""What a GGUF's metadata says (or llama.cpp fixes by convention) that transformers' GGUF config
reader leaves at its defaults, for the families where the two differ; llama.cpp, which wrote
and runs these files, is the reference for their meaning.

transformers 5 reads a Gemma 2 file with the soft-caps of the real Gemma 2 (50, 30) and a query
scale of 256 ** -0.5 whatever the file says, a Gemma 3 file without its global layers' rope
scaling, a Phi-3 file with full rotary, no longrope and a 4096-token pretraining length, and a
Qwen MoE file with its class's default expert sizes and top-k renormalisation. A
shard serving such a file with those defaults computes another model than the file's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Gemma's query scale: llama.cpp uses head_dim ** -0.5, except for the 27B models (known by
# their layer count), where it is (hidden / heads) ** -0.5.
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
# Gemma 3's local (sliding) layers: llama.cpp's fixed rope base, and one global layer in six.
_GEMMA3_LOCAL_ROPE_BASE = 10000.0
_SLIDING_PATTERN = {"gemma2": 2, "gemma3": 6}


def file_config(reader, arch: str) -> dict[str, Any]:  # noqa: ANN001 (gguf.GGUFReader)
    """Config fields of a GGUF of `arch` as llama.cpp reads the file: overrides for what
    transformers' reader produced. Empty for the families it reads right."""

    def value(key: str) -> Any:
        field = reader.get_field(f"{arch}.{key}")
        return None if field is None else field.contents()

    if arch in ("gemma2", "gemma3"):
        return _gemma(arch, value)
    if arch == "phi3":
        return _phi3(reader, value)
    if arch in ("qwen2moe", "qwen3moe"):
        return _qwen_moe(reader, arch, value)
    return {}


def _gemma(arch: str, value) -> dict[str, Any]:  # noqa: ANN001
    layers = int(value("block_count"))
    heads = int(value("attention.head_count"))
    head_dim = int(value("attention.key_length") or value("embedding_length") // heads)
    is_27b = layers == _GEMMA_27B_LAYERS[arch]
    window = value("attention.sliding_window")
    pattern = int(value("attention.sliding_window_pattern") or _SLIDING_PATTERN[arch])
    local = [bool(window) and (i + 1) % pattern != 0 for i in range(layers)]
    out: dict[str, Any] = {
        "query_pre_attn_scalar": int(value("embedding_length")) // heads if is_27b else head_dim,
        "final_logit_softcapping": value("final_logit_softcapping"),
        "sliding_window": int(window) if window else None,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in local],
    }
    if arch == "gemma2":
        out["attn_logit_softcapping"] = value("attn_logit_softcapping")
        return out
    base = float(value("rope.freq_base") or 1_000_000.0)  # Gemma 3's global base when unstated
    global_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": base}
    if value("rope.scaling.type") == "linear":
        global_rope = {**global_rope, "rope_type": "linear", "factor": value("rope.scaling.factor")}
    out["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": _GEMMA3_LOCAL_ROPE_BASE},
        "full_attention": global_rope,
    }
    return out


def _phi3(reader, value) -> dict[str, Any]:  # noqa: ANN001
    heads = int(value("attention.head_count"))
    head_dim = int(value("embedding_length")) // heads
    rotary = value("rope.dimension_count")
    partial = 1.0 if rotary is None else int(rotary) / head_dim
    original = value("rope.scaling.original_context_length")
    context = int(value("context_length"))
    window = value("attention.sliding_window")
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(value("rope.freq_base") or 10000.0),
        "partial_rotary_factor": partial,
    }
    factors = {t.name: t for t in reader.tensors if t.name.startswith("rope_factors_")}
    if factors:
        rope |= {
            "rope_type": "longrope",
            "long_factor": _floats(factors["rope_factors_long.weight"]),
            "short_factor": _floats(factors["rope_factors_short.weight"]),
            "original_max_position_embeddings": int(original),
        }
        if value("rope.scaling.attn_factor") is not None:
            rope["attention_factor"] = float(value("rope.scaling.attn_factor"))
    return {
        "rope_parameters": rope,
        "partial_rotary_factor": partial,
        "original_max_position_embeddings": int(original or context),
        "max_position_embeddings": context,
        "sliding_window": int(window) if window else None,
    }


def _qwen_moe(reader, arch: str, value) -> dict[str, Any]:  # noqa: ANN001
    """The experts' sizes (transformers maps only their count and top-k), whether the top-k
    weights are renormalised (llama.cpp: Qwen3-MoE yes, Qwen2-MoE no, unless the file says), and
    which layers are dense: those without stacked experts in the file."""
    stacked = (t.name for t in reader.tensors if t.name.endswith("ffn_gate_exps.weight"))
    sparse = {name.split(".")[1] for name in stacked}
    layers = int(value("block_count"))
    norm = value("expert_weights_norm")
    out: dict[str, Any] = {
        "moe_intermediate_size": int(value("expert_feed_forward_length")),
        "norm_topk_prob": arch == "qwen3moe" if norm is None else bool(norm),
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i in range(layers) if str(i) not in sparse],
    }
    if arch == "qwen2moe":
        shared = value("expert_shared_feed_forward_length")
        out["shared_expert_intermediate_size"] = int(shared or 0)
    return out


# What a Llama config (transformers' reading of a llama file) shares with Mixtral's.
_MIXTRAL_KEPT = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
    "tie_word_embeddings", "rope_parameters", "bos_token_id", "eos_token_id",
)  # fmt: skip


def mixtral_config(llama_config, reader):  # noqa: ANN001, ANN201 (transformers configs)
    """A llama file with experts (what llama.cpp makes of Mixtral) as a MixtralConfig: the
    Llama config transformers read, plus the experts' count and top-k. Each expert's
    intermediate size is the file's feed_forward_length, as in Mixtral's own config."""
    from transformers import MixtralConfig

    kept = llama_config.to_dict()
    return MixtralConfig(
        **{key: kept[key] for key in _MIXTRAL_KEPT if kept.get(key) is not None},
        num_local_experts=int(reader.get_field("llama.expert_count").contents()),
        num_experts_per_tok=int(reader.get_field("llama.expert_used_count").contents()),
        sliding_window=None,
    )


def _floats(tensor) -> list[float]:  # noqa: ANN001 (a gguf ReaderTensor of F32)
    return [float(v) for v in np.asarray(tensor.data, dtype=np.float32).reshape(-1)]
