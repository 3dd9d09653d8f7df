"""Qwen3-MoE: Qwen3's attention (q/k norms) over Qwen2-MoE's experts without the shared one."""

from __future__ import annotations

from typing import Any

from shard.models.config import ModelConfig
from shard.models.qwen2_moe import Qwen2MoeForCausalLM, qwen_moe_config


class Qwen3MoeForCausalLM(Qwen2MoeForCausalLM):
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return qwen_moe_config(raw, config, shared=False)
