"""K-EXAONE (LG AI, `ExaoneMoeForCausalLM`): EXAONE 4's attention (per-head q/k norms; with a
sliding window, only the sliding layers rotate) in Llama's pre-norm layers, whose MLPs
`mlp_layer_types` lists dense or sparse; the sparse ones routed as DeepSeek-V3 routes
(shard/models/glm4_moe.py: sigmoid scores with a correction bias, grouped, renormalised, scaled)
with `num_shared_experts` ungated shared experts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.exaone4 import exaone_rotary_layers
from shard.models.glm4_moe import GLM4_MOE_NAMES, grouped_sigmoid_moe, listed_sparse_layers
from shard.models.names import STACKED_EXPERT_NAMES, in_some_layer, stacked_experts
from shard.weights import Weights

# The Hub's files keep each router's correction bias on the MoE block (`mlp.`), where
# transformers' module (and so a state dict saved as is) holds it on the router (`mlp.gate.`).
EXAONE_MOE_NAMES = {
    **GLM4_MOE_NAMES,
    "router_correction_bias": ("model.layers.{i}.mlp.e_score_correction_bias",),
}


class ExaoneMoeForCausalLM(DecoderModel):
    NAMES = EXAONE_MOE_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        # DeepSeek-V3's router under EXAONE's field names
        deepseek = {
            **raw,
            "n_routed_experts": raw.get("num_experts"),
            "n_shared_experts": raw.get("num_shared_experts"),
        }
        moe = listed_sparse_layers(raw, config, grouped_sigmoid_moe(deepseek, config))
        return replace(config, rotary_layers=exaone_rotary_layers(raw, config), moe=moe)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        table = cls.NAMES
        router_bias = GLM4_MOE_NAMES["router_correction_bias"]
        if in_some_layer(weights.has, router_bias[0]):
            table = {**table, "router_correction_bias": router_bias}
        return {**table, **STACKED_EXPERT_NAMES} if stacked_experts(weights.has) else table
