"""Gemma 3 (text): Gemma 2's blocks with `1 + w` norms over each head's query and key, a rope
per layer type (local layers their own base, global ones theirs, with their scaling), and the
5:1 sliding pattern of layer_types. Attention soft-capping is in the config (null in the
released models) and served when set."""

from __future__ import annotations

from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.gemma2 import GEMMA_NAMES, gemma_config
from shard.models.text_only import TextOnly


class Gemma3ForCausalLM(DecoderModel):
    NAMES = GEMMA_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("use_bidirectional_attention"):
            # EmbeddingGemma's encoder mode: not a causal LM
            raise ValueError("use_bidirectional_attention=true is not supported (causal LMs only)")
        return gemma_config(raw, config)


class Gemma3ForConditionalGeneration(TextOnly, Gemma3ForCausalLM):
    """Gemma 3 4B and up, as released: the vision-language checkpoint, served as its language
    model (text only; shard/models/text_only.py)."""
