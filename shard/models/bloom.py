"""BLOOM (`BloomForCausalLM`: BLOOM, BLOOMZ). Under `transformer.` (the original releases name the
modules without it: both are read): the word embeddings normed by a LayerNorm before the first
layer, q/k/v fused in one `query_key_value` whose rows hold each head's q, k and v in turn,
the `dense` output projection, biases everywhere, LayerNorms with a bias, an ungated tanh-gelu
MLP dense_h_to_4h -> dense_4h_to_h, the head tied to the embeddings. No rotary: every head
adds its ALiBi slope times (key position - query position) to its scores (BLOOM's slopes,
shard/layers/alibi.py, also for head counts that are not powers of two)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch

from shard.layers.alibi import bloom_slopes
from shard.layers.norm import NORMS
from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.names import Names, without_prefix
from shard.weights import Weights

LAYER = "transformer.h.{i}"
BLOOM_NAMES = {
    "embed_tokens": ("transformer.word_embeddings",),
    "embed_norm": ("transformer.word_embeddings_layernorm",),
    "norm": ("transformer.ln_f",),
    "lm_head": ("lm_head",),
    "input_layernorm": (f"{LAYER}.input_layernorm",),
    "post_attention_layernorm": (f"{LAYER}.post_attention_layernorm",),
    "qkv_proj": (f"{LAYER}.self_attention.query_key_value",),
    "o_proj": (f"{LAYER}.self_attention.dense",),
    "up_proj": (f"{LAYER}.mlp.dense_h_to_4h",),
    "down_proj": (f"{LAYER}.mlp.dense_4h_to_h",),
}


class BloomForCausalLM(DecoderModel):
    NAMES = BLOOM_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False}

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **kwargs: Any) -> ModelConfig:
        heads = raw["n_head"]
        raw = {
            **raw,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,  # (no GQA; a stray field is ignored)
            "num_hidden_layers": raw["n_layer"],
            "intermediate_size": 4 * raw["hidden_size"],  # as transformers builds the MLP
            "hidden_act": "gelu_pytorch_tanh",  # bloom_gelu: the tanh form
            "tie_word_embeddings": raw.get("tie_word_embeddings", True),
        }
        return super().config_from_dict(raw, **kwargs)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("apply_residual_connection_post_layernorm"):
            raise UnsupportedArchitectureError(
                "BLOOM with apply_residual_connection_post_layernorm true (the normed input as "
                "the residual) is not supported"
            )
        return replace(
            config,
            norm="layer_bias",
            rms_norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            qkv_by_head=True,
            rotary_layers=(False,) * config.num_layers,
            alibi_slopes=bloom_slopes(config.num_heads),
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if weights.has("transformer.word_embeddings.weight"):
            return cls.NAMES
        return without_prefix(cls.NAMES, "transformer.")  # the originals: `h.0...`

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        super().__init__(config, weights, attention)
        prefix = Names(self.names_for(weights)).one("embed_norm")
        self.embed_norm = NORMS[config.norm].load(weights, prefix, config.rms_norm_eps)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The embeddings through word_embeddings_layernorm: in `embed`, which the forward, the
        CPU decode loop and CUDA graphs all call."""
        return self.embed_norm(super().embed(input_ids, positions))
