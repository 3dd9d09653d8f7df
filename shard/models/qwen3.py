"""Qwen3: Llama's blocks with an RMSNorm over each head's query and key before rotary."""

from __future__ import annotations

from shard.models.blocks import DecoderModel


class Qwen3ForCausalLM(DecoderModel):
    CONFIG_DEFAULTS = {"qk_norm": True}
