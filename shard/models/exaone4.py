"""EXAONE 4.0 (LG AI): norms after attention and the MLP only, as OLMo 2 (shard/models/olmo2.py),
with per-head q/k norms as Qwen3; where the config has a sliding window, its sliding layers
(`layer_types`, three in four) rotate and its full-attention layers have no position encoding
(NoPE). Without a sliding window every layer rotates."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.olmo2 import OLMO2_NAMES


def exaone_rotary_layers(raw: dict[str, Any], config: ModelConfig) -> tuple[bool, ...]:
    """With a sliding window only the sliding layers rotate (the full ones are NoPE); without
    one, every layer (an empty tuple)."""
    if raw.get("sliding_window") is None:
        return ()
    return tuple(window is not None for window in config.layer_windows)


class Exaone4ForCausalLM(DecoderModel):
    NAMES = OLMO2_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        rotary = exaone_rotary_layers(raw, config)
        return replace(config, sandwich_norms=True, pre_norms=False, rotary_layers=rotary)
