"""K-EXAONE (LG AI, `ExaoneMoeForCausalLM`): EXAONE 4's attention (per-head q/k norms; with a
sliding window, only the sliding layers rotate) in Llama's pre-norm layers, whose MLPs
`mlp_layer_types` lists dense or sparse; the sparse ones routed as DeepSeek-V3 routes
(shard/models/glm4_moe.py: sigmoid scores with a correction bias, grouped, renormalised, scaled)
with `num_shared_experts` ungated shared experts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.glm4_moe import GLM4_MOE_NAMES, grouped_sigmoid_moe
from shard.models.names import STACKED_EXPERT_NAMES, stacked_experts
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
        rotary = ()
        if raw.get("sliding_window") is not None:
            rotary = tuple(window is not None for window in config.layer_windows)
        # DeepSeek-V3's router under EXAONE's field names
        deepseek = {
            **raw,
            "n_routed_experts": raw.get("num_experts"),
            "n_shared_experts": raw.get("num_shared_experts"),
        }
        moe = grouped_sigmoid_moe(deepseek, config)
        kinds = raw.get("mlp_layer_types")
        if kinds is not None:
            if len(kinds) != config.num_layers or not set(kinds) <= {"dense", "sparse"}:
                raise UnsupportedArchitectureError(
                    f"mlp_layer_types = {kinds} must name each of the {config.num_layers} "
                    "layers 'dense' or 'sparse'"
                )
            moe = replace(moe, sparse_layers=tuple(kind == "sparse" for kind in kinds))
        return replace(config, rotary_layers=rotary, moe=moe)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        table = cls.NAMES
        if any(weights.has(f"model.layers.{i}.mlp.gate.e_score_correction_bias") for i in
               range(_MAX_LAYERS)):  # fmt: skip
            table = {**table, "router_correction_bias": GLM4_MOE_NAMES["router_correction_bias"]}
        return {**table, **STACKED_EXPERT_NAMES} if stacked_experts(weights.has) else table


_MAX_LAYERS = 1024
