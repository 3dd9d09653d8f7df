"""Aleph Alpha's Kolibri (`Kolibri1ForCausalLM`): EXAONE 4's attention (per-head q/k norms; its
sliding layers rotate, its full ones, every fifth, have no position encoding:
shard/models/exaone4.py) in GLM-4's four-norm layer, and Mixture-of-Experts MLPs in every layer:
the top k of float32 router logits plus a per-expert correction bias, each chosen expert
weighted by the sigmoid of its logit, renormalised (`norm_topk_prob`), beside a shared SwiGLU
expert added ungated."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, MoeConfig
from shard.models.exaone4 import exaone_rotary_layers
from shard.models.glm4 import GLM4_NAMES
from shard.models.glm4_moe import GLM4_MOE_NAMES
from shard.models.names import STACKED_EXPERT_NAMES, in_some_layer, stacked_experts
from shard.models.qwen2_moe import experts_per_token
from shard.weights import Weights

_LAYER = "model.layers.{i}"
# the Hub's names (transformers' module names, GLM-4's, where it saves them as it holds them)
KOLIBRI_NAMES = {
    **GLM4_MOE_NAMES,
    "post_attention_layernorm": (f"{_LAYER}.post_attn_norm",),
    "pre_feedforward_layernorm": (f"{_LAYER}.post_attention_layernorm",),
    "post_feedforward_layernorm": (f"{_LAYER}.post_ffn_norm",),
    "router_correction_bias": (f"{_LAYER}.moe.router.expert_bias",),
}
_SANDWICH = ("post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
_MODULE_NAMES = {
    **{ours: GLM4_NAMES[ours] for ours in _SANDWICH},
    "router_correction_bias": GLM4_MOE_NAMES["router_correction_bias"],
}


def kolibri_moe(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
    experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
    return MoeConfig(
        num_experts=experts,
        top_k=experts_per_token(raw, experts),
        intermediate_size=raw["moe_intermediate_size"],
        renormalize=bool(raw.get("norm_topk_prob", True)),
        round_weights=False,  # float32 weights, as transformers multiplies them
        sparse_layers=(True,) * config.num_layers,
        shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size") or 0),
        scoring="sigmoid",
        shared_expert_gated=False,
        float32_router=True,
        correction_bias=True,
        correction_on_logits=True,
    )


class Kolibri1ForCausalLM(DecoderModel):
    NAMES = KOLIBRI_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(
            config,
            sandwich_norms=True,
            rotary_layers=exaone_rotary_layers(raw, config),
            moe=kolibri_moe(raw, config),
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        table = cls.NAMES
        if in_some_layer(weights.has, f"{_LAYER}.post_self_attn_layernorm.weight"):
            table = {**table, **_MODULE_NAMES}
        return {**table, **STACKED_EXPERT_NAMES} if stacked_experts(weights.has) else table
