"""ERNIE 4.5 dense (`Ernie4_5ForCausalLM`, Baidu's ERNIE-4.5-0.3B): Llama's layers with a bias on
every projection or none (`use_bias`), and GLM's rotation of interleaved pairs over the whole
head."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig


class Ernie4_5ForCausalLM(DecoderModel):
    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        bias = bool(raw.get("use_bias", False))
        return replace(
            config,
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
            rope=replace(config.rope, interleaved=True),
        )
