"""OLMoE (AI2's OLMoE-1B-7B): Llama's pre-norm layers with q and k each normed over the whole
projection (as OLMo 2, but with Llama's norm rounding), and a Mixture-of-Experts MLP in every
layer: softmax router, top-k renormalised only with norm_topk_prob, each expert
`intermediate_size` wide; experts per module (the Hub's files) or stacked (transformers 5's)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig, MoeConfig, UnsupportedArchitectureError
from shard.models.qwen2_moe import Qwen2MoeForCausalLM, experts_per_token


class OlmoeForCausalLM(Qwen2MoeForCausalLM):
    CONFIG_DEFAULTS: dict[str, Any] = {}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("clip_qkv") is not None:
            raise UnsupportedArchitectureError(
                f"clip_qkv = {raw['clip_qkv']} (q/k/v clamped before attention) is not supported"
            )
        return replace(config, qk_norm=True, projection_qk_norm=True, moe=olmoe_moe(raw, config))


def olmoe_moe(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
    """OLMoE's experts, in every layer (FlexOlmo's too)."""
    experts = raw.get("num_experts") or raw.get("num_local_experts") or 0
    return MoeConfig(
        num_experts=experts,
        top_k=experts_per_token(raw, experts),
        intermediate_size=config.intermediate_size,
        renormalize=bool(raw.get("norm_topk_prob", False)),
        round_weights=True,
        sparse_layers=(True,) * config.num_layers,
    )
