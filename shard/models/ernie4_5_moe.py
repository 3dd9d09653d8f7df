"""ERNIE 4.5 Mixture-of-Experts (`Ernie4_5_MoeForCausalLM`: ERNIE-4.5-21B-A3B, 300B-A47B): the
dense ERNIE 4.5's attention (shard/models/ernie4_5.py), sparse MLPs in the layers from
`moe_layer_start_index` to `moe_layer_end_index` every `moe_layer_interval` (dense ones
between), routed as transformers routes them: softmax probabilities in float32, the top
`moe_k` chosen by probability plus the per-expert `e_score_correction_bias`, weighted by their
probabilities renormalised (divided by at least `moe_norm_min`) and rounded to the model's
dtype; `moe_num_shared_experts` shared experts as one ungated MLP. The releases' multi-token
prediction modules (`mtp...`) are skipped, as transformers skips them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig, MoeConfig, UnsupportedArchitectureError
from shard.models.ernie4_5 import Ernie4_5ForCausalLM
from shard.models.glm4_moe import GLM4_MOE_NAMES
from shard.models.names import STACKED_EXPERT_NAMES, stacked_experts
from shard.weights import Weights

ERNIE_MOE_NAMES = {
    **GLM4_MOE_NAMES,
    "router_correction_bias": ("model.layers.{i}.mlp.moe_statics.e_score_correction_bias",),
}
# transformers 5's own module names (save_original_format off) put the bias under the router
ERNIE_MOE_STACKED_NAMES = {
    **STACKED_EXPERT_NAMES,
    "router_correction_bias": ("model.layers.{i}.mlp.gate.moe_statics.e_score_correction_bias",),
}


def ernie_moe(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
    experts, top_k = int(raw.get("moe_num_experts") or 0), int(raw.get("moe_k") or 0)
    if not 1 <= top_k <= experts:
        raise UnsupportedArchitectureError(
            f"moe_k = {top_k} must be between 1 and moe_num_experts = {experts}"
        )
    layers = config.num_layers
    start, end = int(raw.get("moe_layer_start_index", 1)), int(raw.get("moe_layer_end_index", -1))
    end = layers - 1 if end == -1 else end  # as transformers' config reads -1
    interval = raw.get("moe_layer_interval")
    interval = 1 if interval is None else int(interval)
    if interval < 1:
        raise UnsupportedArchitectureError(f"moe_layer_interval = {interval} must be positive")
    inter = raw["moe_intermediate_size"]
    return MoeConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=inter,
        renormalize=True,
        round_weights=True,  # transformers casts the weights to the hidden states' dtype
        sparse_layers=tuple((i + 1) % interval == 0 and start <= i <= end for i in range(layers)),
        shared_expert_intermediate_size=inter * int(raw.get("moe_num_shared_experts") or 0),
        shared_expert_gated=False,
        float32_router=True,
        correction_bias=True,
        renormalize_min=float(raw.get("moe_norm_min") or 0.0),
    )


class Ernie4_5_MoeForCausalLM(Ernie4_5ForCausalLM):
    NAMES = ERNIE_MOE_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("use_bias"):
            # the releases have none; transformers' MoE class then gives lm_head a bias too
            raise UnsupportedArchitectureError(
                "use_bias = true: ERNIE 4.5 MoE's lm_head then has a bias, which is not served"
            )
        return replace(super().adapt_config(raw, config), moe=ernie_moe(raw, config))

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if stacked_experts(weights.has):
            return {**cls.NAMES, **ERNIE_MOE_STACKED_NAMES}
        return cls.NAMES

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        weights.skip_named("mtp")
        super().__init__(config, weights, attention)
