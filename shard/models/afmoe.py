"""AFMoE (Arcee's Trinity models, `AfmoeForCausalLM`): four float32 norms a layer (before and
after attention and the MLP, as Gemma 2's), per-head q/k norms, attention's output gated by
sigmoid(gate_proj(x)) before o_proj, rotary only in the sliding layers (layer_types; the full
ones have no position encoding), embeddings times sqrt(hidden) with mup_enabled; after the first
`num_dense_layers` dense MLPs, Mixture-of-Experts ones: sigmoid scores chosen with a per-expert
bias (`expert_bias`), the top k renormalised and times `route_scale`, plus `num_shared_experts`
shared experts as one ungated MLP."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, MoeConfig
from shard.models.glm4_moe import GLM4_MOE_NAMES
from shard.models.names import STACKED_EXPERT_NAMES, stacked_experts
from shard.models.qwen2_moe import experts_per_token
from shard.weights import Weights

AFMOE_NAMES = {
    **GLM4_MOE_NAMES,
    "pre_feedforward_layernorm": ("model.layers.{i}.pre_mlp_layernorm",),
    "post_feedforward_layernorm": ("model.layers.{i}.post_mlp_layernorm",),
    "attn_output_gate": ("model.layers.{i}.self_attn.gate_proj",),
    "router": ("model.layers.{i}.mlp.router.gate",),
    "router_correction_bias": ("model.layers.{i}.mlp.expert_bias",),
}


def afmoe_moe(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
    experts = int(raw.get("num_experts") or 0)
    dense = int(raw.get("num_dense_layers") or 0)
    return MoeConfig(
        num_experts=experts,
        top_k=experts_per_token(raw, experts),
        intermediate_size=raw["moe_intermediate_size"],
        renormalize=True,
        round_weights=False,  # the experts' outputs weighted in float32
        sparse_layers=tuple(i >= dense for i in range(config.num_layers)),
        shared_expert_intermediate_size=raw["moe_intermediate_size"]
        * int(raw.get("num_shared_experts") or 0),
        scoring="sigmoid",
        routed_scaling=float(raw.get("route_scale") or 1.0),
        shared_expert_gated=False,
        correction_bias=True,
    )


class AfmoeForCausalLM(DecoderModel):
    NAMES = AFMOE_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        kinds = raw.get("layer_types") or ()
        return replace(
            config,
            norm="fp32_rms",
            sandwich_norms=True,
            attention_output_gate=True,
            rotary_layers=tuple(kind == "sliding_attention" for kind in kinds),
            embed_scale=math.sqrt(config.hidden_size) if raw.get("mup_enabled") else None,
            moe=afmoe_moe(raw, config),
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if not stacked_experts(weights.has):
            return cls.NAMES
        return {**cls.NAMES, **STACKED_EXPERT_NAMES, "router": AFMOE_NAMES["router"]}
