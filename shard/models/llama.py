"""Llama, Mistral and Ministral: the shared blocks as they are (two RMSNorms a layer, SwiGLU,
rotary over whole heads, sliding windows where the config names them); and Mistral Small 3.1
and later as released, vision-language checkpoints around a Mistral, served text only."""

from __future__ import annotations

from shard.models.blocks import DecoderModel
from shard.models.names import LLAMA_NAMES
from shard.models.text_only import TextOnly


class LlamaForCausalLM(DecoderModel):
    NAMES = LLAMA_NAMES


class Mistral3ForConditionalGeneration(TextOnly, LlamaForCausalLM):
    """Mistral Small 3.1 / 3.2, Magistral Small: Pixtral's vision tower before a Mistral."""
