"""IBM Granite with sliding windows (GraniteSWAForCausalLM, and its Mixture-of-Experts
GraniteMoeSWAForCausalLM): Granite's multipliers (shard/models/granite.py) with windows in the
layers layer_types names, a learned sink logit per head in every softmax (as gpt-oss's), and a
rope base per layer (`layer_rope_theta`; 0: that layer has no position encoding). The MoE one has
Granite 3 MoE's experts (shard/models/granite_moe.py) and, with shared_intermediate_size, one
ungated shared expert (`shared_mlp`, its gate and up fused)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig
from shard.models.granite import GraniteForCausalLM
from shard.models.granite_moe import GraniteMoeSharedForCausalLM
from shard.models.names import LLAMA_NAMES
from shard.weights import Weights

SINKS = {"sinks": ("model.layers.{i}.self_attn.sinks",)}


def windows_sinks_ropes(raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
    """What both state alike: sinks, and a rope base per layer (0: none)."""
    thetas = raw.get("layer_rope_theta") or [config.rope.theta] * config.num_layers
    if len(thetas) != config.num_layers:
        raise ValueError(f"layer_rope_theta names {len(thetas)} layers, not {config.num_layers}")
    ropes = tuple(replace(config.rope, theta=float(t)) if t else config.rope for t in thetas)
    return replace(
        config,
        attention_sinks=True,
        layer_ropes=ropes,
        rotary_layers=tuple(bool(t) for t in thetas),
    )


class GraniteSWAForCausalLM(GraniteForCausalLM):
    NAMES = {**LLAMA_NAMES, **SINKS}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return windows_sinks_ropes(raw, super().adapt_config(raw, config))


class GraniteMoeSWAForCausalLM(GraniteMoeSharedForCausalLM):
    NAMES = {**GraniteMoeSharedForCausalLM.NAMES, **SINKS}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return windows_sinks_ropes(raw, super().adapt_config(raw, config))

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        return {**super().names_for(weights), **SINKS}
