"""Qwen3-MoE: Qwen3's attention (q/k norms) over Qwen2-MoE's experts without the shared one.
Qwen3-VL-MoE as released is served as this language model, text only
(shard/models/text_only.py; its rope and deepstack features as Qwen3-VL's, shard/models/qwen3.py),
its experts stacked, input dimension first in the Hub's files."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig
from shard.models.qwen2_moe import Qwen2MoeForCausalLM, qwen_moe_config
from shard.models.text_only import TextOnly


class Qwen3MoeForCausalLM(Qwen2MoeForCausalLM):
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return qwen_moe_config(raw, config, shared=False)


class Qwen3VLMoeForConditionalGeneration(TextOnly, Qwen3MoeForCausalLM):
    """Qwen3-VL-MoE, served as its language model."""

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = super().adapt_config(raw, config)
        if config.moe is None:
            return config
        # the Hub's [E, H, 2I] and [E, I, H], or transformers 5's own [E, 2I, H] and [E, H, I]
        return replace(config, moe=replace(config.moe, transposed_experts=None))
