"""Writes small GGUF files from the tiny random HF checkpoints, with the `gguf` package itself
(as llama.cpp's converter does: rope rows of Q/K interleaved, norms kept in F32, the tokenizer
and chat template in the metadata), so tests can serve a GGUF and compare with transformers
loading the same file, or the checkpoint it was written from.

Gemma 2/3, Phi-3, Qwen2/3-MoE and Mixtral files are written as convert_hf_to_gguf.py writes
them: tensor names from the gguf package's own HF -> GGUF map, experts stacked per layer,
Gemma's norms stored as 1 + w, the metadata each converter adds (soft-caps, sliding window,
rotary dimensions, longrope's factor tensors, expert counts)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

_BLOCK = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def _gguf_name(hf: str) -> str:
    module, suffix = hf.rsplit(".", 1)
    if module.startswith("model.layers."):
        _, _, layer, rest = module.split(".", 3)
        return f"blk.{layer}.{_BLOCK[rest]}.{suffix}"
    return f"{_GLOBAL[module]}.{suffix}"


def _interleave_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's `permute` (convert_hf_to_gguf.py, LlamaModel)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


# The architectures written through the gguf package's name map and their converter's extras.
_MAPPED = ("gemma2", "gemma3", "phi3", "qwen2moe", "qwen3moe")


def write_gguf(
    model_dir: Path,
    out: Path,
    qtype: str = "F32",
    *,
    architecture: str = "llama",
    sentencepiece: bool = False,
    legacy_experts: bool = False,
) -> Path:
    """`model_dir` (a tiny model from launcher.tiny_models) as the GGUF file `out`, its 2-D
    weights stored as `qtype` (F32, F16, Q8_0, Q4_0, ... whatever gguf can quantize).

    `sentencepiece`: the vocabulary as Gemma's and Phi-3's converters write theirs (tokenizer
    model "llama": pieces with scores, no merges, BOS added), from a SentencePiece-style BPE
    trained on the tiny models' corpus, instead of the checkpoint's byte-level BPE.
    `legacy_experts`: a Mixtral's experts one tensor each (blk.L.ffn_gate.E.weight), as
    llama.cpp's converter wrote them before it stacked them."""
    import gguf

    config = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    w = gguf.GGUFWriter(str(out), architecture)
    w.add_name("tiny-test-model")
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = config.get("rope_parameters") or {}
    if architecture != "gemma3":  # its global layers' base (below)
        w.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if architecture != "phi3":  # the rotated part of the head (below)
        w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)  # llama.cpp writes these; Qwen3's head_dim is not hidden / heads
    w.add_value_length(head_dim)
    w.add_vocab_size(config["vocab_size"])
    # Mixtral: a llama file with experts (its converter is the Llama one's, experts merged).
    mixtral = architecture == "llama" and "num_local_experts" in config
    mapped = architecture in _MAPPED or mixtral
    if mapped:
        _add_converter_metadata(w, architecture, config, head_dim)

    if sentencepiece:
        _add_sentencepiece_vocab(w, config)
    else:
        _add_byte_level_vocab(w, config, tok)
    w.add_chat_template(tok_config.get("chat_template") or _chat_template(model_dir))

    quant = gguf.GGMLQuantizationType[qtype]
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    state = load_file(str(model_dir / "model.safetensors"))
    legacy = {}
    if legacy_experts:
        legacy = {_legacy_expert_name(n): state.pop(n) for n in list(state) if ".experts." in n}
    if architecture.endswith("moe") or mixtral:
        state = _stack_experts(state)
    if mapped:
        names = gguf.get_tensor_name_map(
            gguf.MODEL_ARCH[architecture.upper()], config["num_hidden_layers"]
        )
        state = {
            names.get_name(hf, try_suffixes=(".weight", ".bias")): t for hf, t in state.items()
        } | legacy
        if architecture.startswith("gemma"):  # Gemma's RMSNorm weights are stored as 1 + w
            state = {n: t + 1 if n.endswith("norm.weight") else t for n, t in state.items()}
        state |= _rope_factor_tensors(config)
    for hf, tensor in state.items():
        name = hf if mapped else _gguf_name(hf)
        data = tensor.to(torch.float32).numpy()
        kind = name.split(".")[-2]
        if architecture == "llama" and kind in heads:
            data = _interleave_rope(data, heads[kind])
        if data.ndim == 1:  # norms and biases stay F32, as llama.cpp keeps them
            w.add_tensor(name, data)
        elif data.shape[-1] % gguf.GGML_QUANT_SIZES[quant][0]:
            # Rows that are not whole blocks of the type: the converter falls back to F16.
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _add_byte_level_vocab(w, config: dict, tok: dict) -> None:  # noqa: ANN001 (gguf.GGUFWriter)
    """The checkpoint's own byte-level BPE, as llama.cpp writes a gpt2-style vocabulary."""
    vocab = tok["model"]["vocab"]
    special = {t["id"] for t in tok["added_tokens"] if t.get("special")}
    tokens = [""] * config["vocab_size"]
    types = [gguf.TokenType.UNUSED] * config["vocab_size"]
    for text, i in vocab.items():
        tokens[i] = text
        types[i] = gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
    for i, text in enumerate(tokens):  # the embedding pads the vocabulary past the tokenizer
        tokens[i] = text or f"<pad_{i}>"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(config["bos_token_id"])
    w.add_eos_token_id(config["eos_token_id"])
    w.add_add_bos_token(False)


def _add_sentencepiece_vocab(w, config: dict) -> None:  # noqa: ANN001 (gguf.GGUFWriter)
    """Pieces ("▁" for a space) with scores and types, the special tokens at the ids the
    tiny checkpoints give them (launcher.tiny_models.SPECIAL_TOKENS)."""
    from tokenizers import SentencePieceBPETokenizer

    from launcher.tiny_models import SPECIAL_TOKENS, _corpus

    trainer = SentencePieceBPETokenizer()
    trainer.train_from_iterator(
        _corpus(), vocab_size=config["vocab_size"], special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )  # fmt: skip
    by_id = {i: piece for piece, i in trainer.get_vocab().items()}
    tokens, types = [], []
    for i in range(config["vocab_size"]):
        piece = by_id.get(i)
        tokens.append(piece or f"<pad_{i}>")
        if piece == "<unk>":
            types.append(gguf.TokenType.UNKNOWN)
        elif piece in SPECIAL_TOKENS:
            types.append(gguf.TokenType.CONTROL)
        else:
            types.append(gguf.TokenType.NORMAL if piece else gguf.TokenType.UNUSED)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])  # merge order: earlier first
    w.add_token_types(types)
    w.add_bos_token_id(SPECIAL_TOKENS.index("<s>"))
    w.add_eos_token_id(SPECIAL_TOKENS.index("</s>"))
    w.add_unk_token_id(SPECIAL_TOKENS.index("<unk>"))
    w.add_add_bos_token(True)


def _add_converter_metadata(w, architecture: str, config: dict, head_dim: int) -> None:  # noqa: ANN001
    """What convert_hf_to_gguf.py adds for these architectures beyond the common keys."""
    if architecture == "gemma2":
        w.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        w.add_final_logit_softcapping(config["final_logit_softcapping"])
        w.add_sliding_window(config["sliding_window"])
    elif architecture == "gemma3":
        rope = config["rope_parameters"]["full_attention"]
        w.add_rope_freq_base(rope["rope_theta"])  # the global layers' base
        if rope.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rope["factor"])
        if config.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(config["final_logit_softcapping"])
        w.add_sliding_window(config["sliding_window"])
    elif architecture == "llama":  # Mixtral: each expert's size is feed_forward_length
        w.add_expert_count(config["num_local_experts"])
        w.add_expert_used_count(config["num_experts_per_tok"])
    elif architecture.endswith("moe"):
        w.add_expert_count(config.get("num_experts") or config["num_local_experts"])
        w.add_expert_used_count(config["num_experts_per_tok"])
        w.add_expert_feed_forward_length(config["moe_intermediate_size"])
        if config.get("shared_expert_intermediate_size"):
            w.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    else:  # phi3
        rope = config["rope_parameters"]
        rotary = int(rope.get("partial_rotary_factor", 1.0) * config["hidden_size"])
        w.add_rope_dimension_count(rotary // config["num_attention_heads"])
        w.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])
        w.add_sliding_window(config.get("sliding_window") or 0)
        if rope.get("long_factor"):
            scale = config["max_position_embeddings"] / config["original_max_position_embeddings"]
            factor = math.sqrt(
                1 + math.log(scale) / math.log(config["original_max_position_embeddings"])
            )
            w.add_rope_scaling_attn_factors(factor if scale > 1 else 1.0)


def _stack_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Hub's per-expert tensors stacked per layer and projection, as the converter merges
    them (`model.layers.L.mlp.experts.gate_proj.weight` [E, rows, cols], Mixtral's
    `block_sparse_moe.experts.w1`, mapped to ffn_gate_exps); Qwen2-MoE's shared-expert gate
    [1, H] stored as a vector, as llama.cpp reads it."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in state.items():
        parts = name.split(".")
        if ".experts." in name:  # model.layers.L.{mlp,block_sparse_moe}.experts.E.PROJ.weight
            merged = ".".join(parts[:5] + parts[6:])
            experts.setdefault(merged, {})[int(parts[5])] = tensor
        elif name.endswith("shared_expert_gate.weight"):
            out[name] = tensor.reshape(-1)
        else:
            out[name] = tensor
    for merged, by_index in experts.items():
        out[merged] = torch.stack([by_index[e] for e in sorted(by_index)])
    return out


def _legacy_expert_name(hf: str) -> str:
    """model.layers.L.block_sparse_moe.experts.E.w1.weight -> blk.L.ffn_gate.E.weight."""
    parts = hf.split(".")
    projection = {"w1": "gate", "w3": "up", "w2": "down"}[parts[6]]
    return f"blk.{parts[2]}.ffn_{projection}.{parts[5]}.weight"


def _rope_factor_tensors(config: dict) -> dict[str, torch.Tensor]:
    """Phi-3 longrope's factors, which the converter stores as two F32 tensors."""
    rope = config.get("rope_parameters") or {}
    if not rope.get("long_factor"):
        return {}
    return {
        "rope_factors_long.weight": torch.tensor(rope["long_factor"], dtype=torch.float32),
        "rope_factors_short.weight": torch.tensor(rope["short_factor"], dtype=torch.float32),
    }


def _chat_template(model_dir: Path) -> str:
    return (model_dir / "chat_template.jinja").read_text()
