"""OLMo 2 and OLMo 3 (AI2): norms after attention and the MLP only, none before (the stream
enters each as it is), q and k each normed over the whole projection rather than per head
(shard/layers/projection_norm.py), norms in float32 (Olmo2RMSNorm). OLMo 3 adds sliding-window
layers (`layer_types`, three in four) with a rope per layer type."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.names import LLAMA_NAMES

OLMO2_NAMES = {
    **LLAMA_NAMES,
    "post_feedforward_layernorm": ("model.layers.{i}.post_feedforward_layernorm",),
}


def olmo2_layers(config: ModelConfig) -> ModelConfig:
    """OLMo 2's layer layout: post norms only, q/k normed over the projection, float32 norms."""
    return replace(
        config,
        norm="fp32_rms",
        sandwich_norms=True,
        pre_norms=False,
        qk_norm=True,
        projection_qk_norm=True,
    )


class Olmo2ForCausalLM(DecoderModel):
    NAMES = OLMO2_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return olmo2_layers(config)


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    pass
