"""Gemma (the first: 2B, 7B, CodeGemma): Gemma 2's blocks without what Gemma 2 added. GeGLU with
gelu's tanh form (the releases say `hidden_act: "gelu"`, which transformers reads as the tanh
form, as this does), two `1 + w` RMSNorms a layer, embeddings scaled by sqrt(hidden), the query
scaled by head_dim, no soft-capping, every layer full attention (transformers' Gemma reads no
`sliding_window`, so neither does this)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.layers.activation import gated_activation
from shard.models.blocks import DecoderModel, sqrt_hidden
from shard.models.config import ModelConfig
from shard.models.names import LLAMA_NAMES

# transformers' GemmaConfig: the legacy "gelu" of the releases meant the tanh approximation
LEGACY_GELU = {"gelu": "gelu_pytorch_tanh"}


class GemmaForCausalLM(DecoderModel):
    NAMES = LLAMA_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        act = raw.get("hidden_act") or "gelu_pytorch_tanh"
        return replace(
            config,
            hidden_act=gated_activation(LEGACY_GELU.get(act, act)),
            norm="gemma_rms",
            embed_scale=sqrt_hidden(raw),
            sliding_window=None,
            layer_windows=(None,) * config.num_layers,
        )
