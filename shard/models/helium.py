"""Helium (Kyutai's Helium-1): Llama's layer with RMSNorms computed and scaled in float32 and
rounded once (transformers' HeliumRMSNorm: `(w * x).to(dtype)`, where Llama rounds before the
scale), rotary in interleaved pairs (as GLM's), q/k/v biases where `attention_bias` says so and
never an o_proj bias."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.names import LLAMA_NAMES


class HeliumForCausalLM(DecoderModel):
    NAMES = LLAMA_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(
            config, norm="fp32_rms", o_bias=False, rope=replace(config.rope, interleaved=True)
        )
