"""Qwen2: Llama's blocks; its configs have no attention_bias field, yet its q/k/v projections
always carry a bias."""

from __future__ import annotations

from shard.models.blocks import DecoderModel


class Qwen2ForCausalLM(DecoderModel):
    CONFIG_DEFAULTS = {"qkv_bias_default": True}
