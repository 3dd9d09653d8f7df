"""Llama, Mistral and Ministral: the shared blocks as they are (two RMSNorms a layer, SwiGLU,
rotary over whole heads, sliding windows where the config names them)."""

from __future__ import annotations

from shard.models.blocks import DecoderModel
from shard.models.names import LLAMA_NAMES


class LlamaForCausalLM(DecoderModel):
    NAMES = LLAMA_NAMES
