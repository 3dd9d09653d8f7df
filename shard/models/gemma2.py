"""Gemma 2: GeGLU (gelu-tanh), four `1 + w` RMSNorms a layer (before and after attention and the
MLP), embeddings scaled by sqrt(hidden), the query scaled by query_pre_attn_scalar, attention
and final logits soft-capped, sliding and full layers alternating (layer_types).
`VaultGemmaForCausalLM` (Google's differentially private VaultGemma) is Gemma 2 with two norms a
layer, before attention and before the MLP (`pre_feedforward_layernorm`), none after."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.layers.activation import gated_activation
from shard.models.blocks import DecoderModel, sqrt_hidden
from shard.models.config import ModelConfig
from shard.models.names import LLAMA_NAMES

GEMMA_NAMES = {
    **LLAMA_NAMES,
    "pre_feedforward_layernorm": ("model.layers.{i}.pre_feedforward_layernorm",),
    "post_feedforward_layernorm": ("model.layers.{i}.post_feedforward_layernorm",),
}


def gemma_config(raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
    """What Gemma 2 and 3 state alike."""
    return replace(
        config,
        hidden_act=gated_activation(raw.get("hidden_activation") or raw.get("hidden_act")),
        norm="gemma_rms",
        sandwich_norms=True,
        embed_scale=sqrt_hidden(raw),
        attention_scale=float(raw["query_pre_attn_scalar"]) ** -0.5,
        attn_softcap=raw.get("attn_logit_softcapping") or None,
        final_softcap=raw.get("final_logit_softcapping") or None,
    )


class Gemma2ForCausalLM(DecoderModel):
    NAMES = GEMMA_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return gemma_config(raw, config)


class VaultGemmaForCausalLM(DecoderModel):
    NAMES = {**LLAMA_NAMES, "post_attention_layernorm": GEMMA_NAMES["pre_feedforward_layernorm"]}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(gemma_config(raw, config), sandwich_norms=False)
