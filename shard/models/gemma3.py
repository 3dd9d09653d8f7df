"""Gemma 3 (text): Gemma 2's blocks with `1 + w` norms over each head's query and key, a rope
per layer type (local layers their own base, global ones theirs, with their scaling), and the
5:1 sliding pattern of layer_types. Attention soft-capping is in the config (null in the
released models) and served when set."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.gemma2 import GEMMA_NAMES, gemma_config
from shard.models.text_only import (
    VISION_PREFIXES,
    adapter_module,
    layout_of,
    nested_table,
    text_config,
)

if TYPE_CHECKING:
    from shard.weights import Weights


class Gemma3ForCausalLM(DecoderModel):
    NAMES = GEMMA_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("use_bidirectional_attention"):
            # EmbeddingGemma's encoder mode: not a causal LM
            raise ValueError("use_bidirectional_attention=true is not supported (causal LMs only)")
        return gemma_config(raw, config)


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """Gemma 3 4B and up, as released: the vision-language checkpoint, served as its language
    model (text only; shard/models/text_only.py)."""

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **fields: Any) -> ModelConfig:
        return super().config_from_dict(text_config(raw), **fields)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        return nested_table(super().names_for(weights), layout_of(weights.has_module))

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        weights.skip_modules(VISION_PREFIXES)
        super().__init__(config, weights, attention)
        self._layout = layout_of(weights.has_module)

    def adapter_module(self, name: str) -> str | None:
        return adapter_module(name, self._layout)
