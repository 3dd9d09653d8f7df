"""SmolLM3: Llama's blocks with no position encoding in the layers `no_rope_layers` marks 0
(every fourth by default: NoPE), and a sliding window where `layer_types` names one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError


def rotary_layers(raw: dict[str, Any], field: str, num_layers: int) -> tuple[bool, ...]:
    """A per-layer 0/1 list of the config (1: the layer rotates), checked for its length."""
    flags = raw.get(field)
    if flags is None:
        return ()
    if len(flags) != num_layers:
        raise UnsupportedArchitectureError(f"{field} names {len(flags)} layers, not {num_layers}")
    return tuple(bool(flag) for flag in flags)


class SmolLM3ForCausalLM(DecoderModel):
    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(
            config, rotary_layers=rotary_layers(raw, "no_rope_layers", config.num_layers)
        )
