"""IBM Granite 3.x (dense): Llama's blocks with four scalars of its config: the embeddings
multiplied by `embedding_multiplier`, the query scale `attention_multiplier` in place of
head_dim ** -0.5, each attention and MLP output multiplied by `residual_multiplier` before its
residual add, and the logits divided by `logits_scaling`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig


class GraniteForCausalLM(DecoderModel):
    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(
            config,
            embed_scale=float(raw.get("embedding_multiplier", 1.0)),
            attention_scale=float(raw.get("attention_multiplier", 1.0)),
            residual_scale=float(raw.get("residual_multiplier", 1.0)),
            logits_divisor=float(raw.get("logits_scaling", 1.0)),
        )
