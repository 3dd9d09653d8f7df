"""IBM Granite 3.x MoE (GraniteMoeForCausalLM: granite-3.0/3.1 1B-A400M and 3B-A800M): Granite's
four multipliers (shard/models/granite.py) over a Mixture-of-Experts MLP in every layer: top-k of
the router's logits, softmax over those k, the weights rounded to the model's dtype;
GraniteMoeShared adds a shared expert. The Hub's files stack each layer's experts in two tensors
(`input_linear`: gate then up, `output_linear`: down) and name the router `router.layer`;
transformers 5 saves them under `experts.` and `router`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig
from shard.models.granite import GraniteForCausalLM
from shard.models.mixtral import experts_in_every_layer
from shard.models.names import LLAMA_NAMES
from shard.weights import Weights

_BLOCK = "model.layers.{i}.block_sparse_moe"
GRANITE_MOE_NAMES = {
    **LLAMA_NAMES,
    "router": (f"{_BLOCK}.router.layer",),
    "expert_gate_up": (f"{_BLOCK}.input_linear.weight",),
    "expert_down": (f"{_BLOCK}.output_linear.weight",),
}
# as transformers 5 saves them
GRANITE_MOE_SAVED_NAMES = {
    **LLAMA_NAMES,
    "router": (f"{_BLOCK}.router",),
    "expert_gate_up": (f"{_BLOCK}.experts.gate_up_proj",),
    "expert_down": (f"{_BLOCK}.experts.down_proj",),
}


class GraniteMoeForCausalLM(GraniteForCausalLM):
    NAMES = GRANITE_MOE_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = super().adapt_config(raw, config)
        return replace(config, moe=experts_in_every_layer(raw, config, round_weights=True))

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if weights.has(GRANITE_MOE_SAVED_NAMES["expert_gate_up"][0].format(i=0)):
            return GRANITE_MOE_SAVED_NAMES
        return cls.NAMES


SHARED_MLP = {
    "shared_expert_gate_up_proj": ("model.layers.{i}.shared_mlp.input_linear",),
    "shared_expert_down_proj": ("model.layers.{i}.shared_mlp.output_linear",),
}


class GraniteMoeSharedForCausalLM(GraniteMoeForCausalLM):
    """Granite MoE with, where shared_intermediate_size says so, one ungated shared expert every
    token takes (`shared_mlp`, its gate and up fused in `input_linear`)."""

    NAMES = {**GRANITE_MOE_NAMES, **SHARED_MLP}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = super().adapt_config(raw, config)
        assert config.moe is not None
        shared = int(raw.get("shared_intermediate_size") or 0)
        moe = replace(config.moe, shared_expert_intermediate_size=shared, shared_expert_gated=False)
        return replace(config, moe=moe)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        table = super().names_for(weights)
        return {**table, **SHARED_MLP} if table is GRANITE_MOE_SAVED_NAMES else cls.NAMES
