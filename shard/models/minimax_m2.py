"""MiniMax-M2 (`MiniMaxM2ForCausalLM`: MiniMax-M2, M2.1, M2.5): GQA attention with q and k each
normed over the whole projection (as OLMo 2's, but by the model's own RMSNorm: the weight applied
after the cast to the model's dtype), rotary over the first `rotary_dim` dims of each head
(transformers reads it as partial_rotary_factor); Mixture-of-Experts MLPs in every layer under
Mixtral's names, routed by sigmoid scores chosen with a per-expert correction bias (DeepSeek-V3's
router with one group and no scaling), the chosen scores renormalised, the router's logits in the
model's dtype. The releases' multi-token-prediction modules (layers past the last) are skipped."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.mixtral import MIXTRAL_NAMES, experts_in_every_layer
from shard.models.names import (
    PER_EXPERT_MLP_NAMES,
    STACKED_EXPERT_NAMES,
    per_expert_under_mlp,
    stacked_experts,
)
from shard.weights import Weights

MINIMAX_M2_NAMES = {
    **MIXTRAL_NAMES,
    "router_correction_bias": ("model.layers.{i}.block_sparse_moe.e_score_correction_bias",),
}
# transformers 5's own layout (what save_pretrained writes)
STACKED_MINIMAX_M2_NAMES = {
    **STACKED_EXPERT_NAMES,
    "router_correction_bias": ("model.layers.{i}.mlp.e_score_correction_bias",),
}


def check_minimax_fields(raw: dict[str, Any]) -> None:
    """The releases' config.json fields that transformers does not read, each naming a variant
    that its modelling code (and so this server) does not compute."""
    wanted = {"scoring_func": "sigmoid", "qk_norm_type": "per_layer", "use_routing_bias": True}
    for field, value in wanted.items():
        if field in raw and raw[field] != value:
            raise UnsupportedArchitectureError(
                f"MiniMaxM2ForCausalLM with {field} = {raw[field]!r} is not supported (only "
                f"{value!r}, as transformers computes the model)"
            )


class MiniMaxM2ForCausalLM(DecoderModel):
    NAMES = MINIMAX_M2_NAMES
    SKIPS_MTP_LAYERS = True

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        check_minimax_fields(raw)
        moe = experts_in_every_layer(raw, config, scoring="sigmoid", correction_bias=True)
        return replace(config, qk_norm=True, projection_qk_norm=True, moe=moe)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if stacked_experts(weights.has):
            return {**cls.NAMES, **STACKED_MINIMAX_M2_NAMES}
        if per_expert_under_mlp(weights.has_module):  # a quantization tool's split experts
            return {**cls.NAMES, **STACKED_MINIMAX_M2_NAMES, **PER_EXPERT_MLP_NAMES}
        return cls.NAMES
