"""Falcon (`FalconForCausalLM`: Falcon-7B, -40B, -180B, Falcon2-11B and their fine-tunes). Under
`transformer.`: q/k/v fused in one `query_key_value`, laid out by the config: the new decoder
architecture's (40B, 180B, 11B) groups a KV head each, its query heads then its k and v; 7B's
multi-query every q row, then the one KV head's k and v; otherwise each head's q, k and v in
turn. Rotary over whole heads, LayerNorms with a bias, an ungated MLP dense_h_to_4h -> gelu ->
dense_4h_to_h, biases where `bias` says (none in the releases). Attention and the MLP run in
parallel on the layer's input (`parallel_attn`, and always in the new architecture), each after
its own norm (`ln_attn`, `ln_mlp`: num_ln_in_parallel_attn 2, the new architecture's default) or
one shared (`input_layernorm`), their outputs summed before the stream is added; sequential
layers are Llama's order. The LM head is tied to the word embeddings.

ALiBi (Falcon-RW) is refused by name: the blocks have no ALiBi."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.weights import Weights

LAYER = "transformer.h.{i}"
FALCON_NAMES = {
    "embed_tokens": ("transformer.word_embeddings",),
    "norm": ("transformer.ln_f",),
    "lm_head": ("lm_head",),
    "input_layernorm": (f"{LAYER}.input_layernorm",),
    "post_attention_layernorm": (f"{LAYER}.post_attention_layernorm",),
    "qkv_proj": (f"{LAYER}.self_attention.query_key_value",),
    "o_proj": (f"{LAYER}.self_attention.dense",),
    "up_proj": (f"{LAYER}.mlp.dense_h_to_4h",),
    "down_proj": (f"{LAYER}.mlp.dense_4h_to_h",),
}
# the parallel layers' two norms: attention's, and the MLP's (read as GPT-NeoX's second norm)
_TWO_NORMS = {
    "input_layernorm": (f"{LAYER}.ln_attn",),
    "post_attention_layernorm": (f"{LAYER}.ln_mlp",),
}


class FalconForCausalLM(DecoderModel):
    NAMES = FALCON_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False}

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if weights.has(f"{_TWO_NORMS['input_layernorm'][0].format(i=0)}.weight"):
            return {**cls.NAMES, **_TWO_NORMS}
        return cls.NAMES

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **kwargs: Any) -> ModelConfig:
        raw = {
            **raw,
            "intermediate_size": raw.get("ffn_hidden_size") or 4 * raw["hidden_size"],
            "hidden_act": raw.get("activation", "gelu"),
            "tie_word_embeddings": raw.get("tie_word_embeddings", True),
        }
        return super().config_from_dict(raw, **kwargs)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("alibi"):
            raise UnsupportedArchitectureError(
                "Falcon with alibi (Falcon-RW's ALiBi position biases) is not supported"
            )
        new = bool(raw.get("new_decoder_architecture"))
        parallel = new or bool(raw.get("parallel_attn", True))
        norms = raw.get("num_ln_in_parallel_attn") or (2 if new else 1)
        if new:
            kv_heads = int(raw.get("num_kv_heads") or config.num_heads)
        else:
            kv_heads = 1 if raw.get("multi_query", True) else config.num_heads
        bias = bool(raw.get("bias", False))
        return replace(
            config,
            num_kv_heads=kv_heads,
            norm="layer_bias",
            rms_norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
            # grouped by KV head, unless every q row comes first (multi-query's one KV head)
            qkv_by_head=new or kv_heads == config.num_heads,
            parallel_block=parallel,
            parallel_mlp_norm=parallel and norms == 2,
            parallel_outputs_summed=parallel,
        )
