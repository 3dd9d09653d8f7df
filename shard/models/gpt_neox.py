"""GPT-NeoX (`GPTNeoXForCausalLM`: Pythia, GPT-NeoX-20B). Under `gpt_neox.`: q/k/v fused in one
`query_key_value` whose rows hold each head's q, k and v in turn, the `dense` output projection,
biases on both (`attention_bias`); LayerNorms with a bias; rotary over the first
`partial_rotary_factor` of each head (the config's rotary_pct); an ungated gelu MLP
dense_h_to_4h -> dense_4h_to_h with biases; the LM head `embed_out` (transformers 5 may save it
as `lm_head`). With `use_parallel_residual` (Pythia's) attention reads input_layernorm's output
and the MLP post_attention_layernorm's, both of the layer's input, and their outputs are summed
before the stream is added; without it, Llama's order."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.weights import Weights

LAYER = "gpt_neox.layers.{i}"
GPT_NEOX_NAMES = {
    "embed_tokens": ("gpt_neox.embed_in",),
    "norm": ("gpt_neox.final_layer_norm",),
    "lm_head": ("embed_out",),
    "input_layernorm": (f"{LAYER}.input_layernorm",),
    "post_attention_layernorm": (f"{LAYER}.post_attention_layernorm",),
    "qkv_proj": (f"{LAYER}.attention.query_key_value",),
    "o_proj": (f"{LAYER}.attention.dense",),
    "up_proj": (f"{LAYER}.mlp.dense_h_to_4h",),
    "down_proj": (f"{LAYER}.mlp.dense_4h_to_h",),
}


class GPTNeoXForCausalLM(DecoderModel):
    NAMES = GPT_NEOX_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False}

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if weights.has("embed_out.weight") or not weights.has("lm_head.weight"):
            return cls.NAMES
        return {**cls.NAMES, "lm_head": ("lm_head",)}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        bias = bool(raw.get("attention_bias", True))
        parallel = bool(raw.get("use_parallel_residual", True))
        return replace(
            config,
            num_kv_heads=config.num_heads,  # (GPT-NeoX has no GQA; a stray field is ignored)
            norm="layer_bias",
            rms_norm_eps=float(raw.get("layer_norm_eps", 1e-5)),
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=True,
            qkv_by_head=True,
            parallel_block=parallel,
            parallel_mlp_norm=parallel,
            parallel_outputs_summed=parallel,
        )
