"""Llama, Mistral and Ministral: the shared blocks as they are (two RMSNorms a layer, SwiGLU,
rotary over whole heads, sliding windows where the config names them); Ministral 3 the same with
its queries scaled by position past the rope's original length (`llama_4_scaling_beta`); and
Mistral Small 3.1 and later and Ministral 3 as released, vision-language checkpoints around one
of those, served text only."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.layers.rotary import QueryPositionScale
from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.names import LLAMA_NAMES
from shard.models.text_only import TextOnly


def llama4_query_scale(raw: dict[str, Any]) -> QueryPositionScale:
    """How a config whose model scales its queries by position past the rope's original length
    does it (ModelConfig.query_position_scale); refused where the rope parameters lack it."""
    rope = raw.get("rope_parameters") or {}
    beta, original = rope.get("llama_4_scaling_beta"), rope.get("original_max_position_embeddings")
    if beta is None or not original:
        raise UnsupportedArchitectureError(
            "rope_parameters: llama_4_scaling_beta and original_max_position_embeddings are "
            "needed to scale the queries by position"
        )
    return QueryPositionScale(float(beta), int(original))


class LlamaForCausalLM(DecoderModel):
    NAMES = LLAMA_NAMES


class Ministral3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(config, query_position_scale=llama4_query_scale(raw))


class LlavaForConditionalGeneration(TextOnly, LlamaForCausalLM):
    """LLaVA-style vision-language checkpoints whose language model is a Llama or a Mistral
    (Pixtral-12B as transformers ports it, ServiceNow's Apriel 1.5 and 1.6, LLaVA 1.5): a
    vision tower and projector before the language model, served text only."""

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        kind = raw.get("model_type")
        if kind not in ("llama", "mistral"):
            raise UnsupportedArchitectureError(
                f"LlavaForConditionalGeneration with a {kind!r} language model "
                "(text_config.model_type) is not supported; a llama or a mistral one is"
            )
        return config


class VoxtralForConditionalGeneration(LlavaForConditionalGeneration):
    """Mistral's Voxtral Mini and Small: a Whisper-style audio encoder and projector before a
    Llama (Ministral's and Mistral Small's layers), served text only."""


class Mistral3ForConditionalGeneration(TextOnly, LlamaForCausalLM):
    """Mistral Small 3.1 / 3.2, Magistral Small (a Mistral), Ministral 3 (a Ministral 3):
    Pixtral's vision tower before the language model."""

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("model_type") == "ministral3":
            return Ministral3ForCausalLM.adapt_config(raw, config)
        return config
