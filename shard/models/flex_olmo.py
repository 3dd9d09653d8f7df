"""FlexOlmo (AI2, `FlexOlmoForCausalLM`): OLMo 2's layers (norms after attention and the MLP
only, q/k normed over the whole projection, float32 norms: shard/models/olmo2.py) with OLMoE's
experts in every layer (shard/models/olmoe.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig
from shard.models.names import QWEN_MOE_NAMES, STACKED_EXPERT_NAMES, stacked_experts
from shard.models.olmo2 import OLMO2_NAMES, Olmo2ForCausalLM
from shard.models.olmoe import olmoe_moe
from shard.weights import Weights

FLEX_OLMO_NAMES = {
    **OLMO2_NAMES,
    **{k: QWEN_MOE_NAMES[k] for k in ("router", "expert_gate_up", "expert_down")},
}


class FlexOlmoForCausalLM(Olmo2ForCausalLM):
    NAMES = FLEX_OLMO_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(super().adapt_config(raw, config), moe=olmoe_moe(raw, config))

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        return {**cls.NAMES, **STACKED_EXPERT_NAMES} if stacked_experts(weights.has) else cls.NAMES
