"""Jais 2 (`Jais2ForCausalLM`: Inception's Jais-2-8B and 70B): Arcee's layer (shard/models/
arcee.py: Llama's attention, an ungated MLP through relu^2) with LayerNorms that carry a bias
(`layer_norm_eps`) in place of RMSNorms, and biases on q/k/v/o and the MLP."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.arcee import ArceeForCausalLM
from shard.models.config import ModelConfig


class Jais2ForCausalLM(ArceeForCausalLM):
    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(
            super().adapt_config(raw, config),
            norm="layer_bias",
            rms_norm_eps=float(raw.get("layer_norm_eps", 1e-5)),
        )
