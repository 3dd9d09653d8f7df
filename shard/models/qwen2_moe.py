"""Qwen2-MoE: Qwen2's attention (q/k/v biases) over Mixture-of-Experts MLPs: softmax router, top-k
renormalised only with norm_topk_prob, a shared expert gated by a sigmoid; the layers that
mlp_only_layers names, or that decoder_sparse_step skips, keep a dense MLP."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, MoeConfig, UnsupportedArchitectureError
from shard.models.names import QWEN_MOE_NAMES, STACKED_EXPERT_NAMES, stacked_experts
from shard.models.text_only import holds
from shard.weights import Weights


def qwen_moe_config(raw: dict[str, Any], config: ModelConfig, *, shared: bool) -> ModelConfig:
    """What Qwen2-MoE and Qwen3-MoE state alike (`shared`: the shared expert's size too)."""
    experts = raw.get("num_experts") or raw.get("num_local_experts") or 0
    step = raw.get("decoder_sparse_step") or 1
    dense = set(raw.get("mlp_only_layers") or ())
    sparse = tuple(
        i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(config.num_layers)
    )
    if not any(sparse):
        return config
    moe = MoeConfig(
        num_experts=experts,
        top_k=experts_per_token(raw, experts),
        intermediate_size=raw["moe_intermediate_size"],
        renormalize=bool(raw.get("norm_topk_prob", False)),
        round_weights=True,
        sparse_layers=sparse,
        shared_expert_intermediate_size=(raw.get("shared_expert_intermediate_size") or 0)
        if shared
        else 0,
    )
    return replace(config, moe=moe)


def experts_per_token(raw: dict[str, Any], experts: int) -> int:
    top_k = raw.get("num_experts_per_tok")
    if not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise UnsupportedArchitectureError(
            f"num_experts_per_tok = {top_k!r} must be between 1 and {experts}"
        )
    return top_k


class Qwen2MoeForCausalLM(DecoderModel):
    NAMES = QWEN_MOE_NAMES
    CONFIG_DEFAULTS = {"qkv_bias_default": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("qkv_bias") is not None:  # transformers 5 states it
            config = replace(config, qkv_bias=bool(raw["qkv_bias"]))
        return qwen_moe_config(raw, config, shared=True)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        # (in the language model's own names or nested in a vision-language checkpoint's:
        # Qwen3-VL-MoE's, shard/models/qwen3_moe.py)
        has = partial(holds, weights)
        return {**cls.NAMES, **STACKED_EXPERT_NAMES} if stacked_experts(has) else cls.NAMES
