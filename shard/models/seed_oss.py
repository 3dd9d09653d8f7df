"""Seed-OSS (`SeedOssForCausalLM`, ByteDance's Seed-OSS-36B): Llama's layers with q/k/v biases
(`attention_bias`, on by default) and an o_proj bias of its own (`attention_out_bias`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig


class SeedOssForCausalLM(DecoderModel):
    CONFIG_DEFAULTS = {"qkv_bias_default": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(config, o_bias=bool(raw.get("attention_out_bias", False)))
