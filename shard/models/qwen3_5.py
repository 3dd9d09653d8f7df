"""Qwen3.5 (text): three layers of Gated DeltaNet linear attention to one of softmax attention
(`layer_types`; shard/models/linear_attention.py), the softmax layers with `1 + w` q/k norms,
partial rotary and an output gate that q_proj computes beside each head's query; `1 + w`
RMSNorms; a dense MLP, or in Qwen3.5-MoE experts with a sigmoid-gated shared expert (top-k
always renormalised).

The released checkpoints are vision-language (Qwen3_5ForConditionalGeneration and its MoE),
served text only; their multimodal rotary gives a text token one position on every axis, which
is plain rotary. The multi-token-prediction weights (`mtp.`) are not run.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import LinearAttentionConfig, ModelConfig, UnsupportedArchitectureError
from shard.models.linear_attention import LINEAR_ATTENTION_NAMES
from shard.models.names import LLAMA_NAMES, QWEN_MOE_NAMES, STACKED_EXPERT_NAMES, stacked_experts
from shard.models.qwen2_moe import qwen_moe_config
from shard.models.text_only import TextOnly, holds
from shard.weights import Weights

_MTP = ("mtp.",)


def linear_attention_config(raw: dict[str, Any], num_layers: int) -> LinearAttentionConfig:
    """config.json's linear_* fields and layer_types (default: every fourth layer softmax)."""
    kinds = raw.get("layer_types") or [
        "full_attention" if (i + 1) % (raw.get("full_attention_interval") or 4) == 0
        else "linear_attention"
        for i in range(num_layers)
    ]  # fmt: skip
    unknown = set(kinds) - {"linear_attention", "full_attention"}
    if unknown:
        raise UnsupportedArchitectureError(f"layer_types {sorted(unknown)} are not supported")
    key_heads, value_heads = raw["linear_num_key_heads"], raw["linear_num_value_heads"]
    if value_heads % key_heads:
        raise UnsupportedArchitectureError(
            f"linear_num_value_heads {value_heads} must be a multiple of linear_num_key_heads "
            f"{key_heads}"
        )
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedArchitectureError(f"hidden_act {act!r}: linear attention's conv is silu")
    return LinearAttentionConfig(
        layers=tuple(kind == "linear_attention" for kind in kinds),
        num_key_heads=key_heads,
        num_value_heads=value_heads,
        key_head_dim=raw["linear_key_head_dim"],
        value_head_dim=raw["linear_value_head_dim"],
        conv_kernel=raw.get("linear_conv_kernel_dim") or 4,
    )


def qwen3_5_config(raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
    return replace(
        config,
        norm="gemma_rms",
        query_gate=True,
        linear_attention=linear_attention_config(raw, config.num_layers),
    )


class Qwen3_5ForCausalLM(DecoderModel):
    NAMES = {**LLAMA_NAMES, **LINEAR_ATTENTION_NAMES}
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return qwen3_5_config(raw, config)

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        weights.skip_modules(_MTP)
        super().__init__(config, weights, attention)


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    NAMES = {**QWEN_MOE_NAMES, **LINEAR_ATTENTION_NAMES}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = qwen_moe_config(raw, qwen3_5_config(raw, config), shared=True)
        if config.moe is None:
            raise UnsupportedArchitectureError("Qwen3.5-MoE's config names no experts")
        # Qwen3.5-MoE's router always renormalises its top-k (its config has no norm_topk_prob)
        return replace(config, moe=replace(config.moe, renormalize=True))

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        # (in the language model's own names or nested in a vision-language checkpoint's)
        has = partial(holds, weights)
        return {**cls.NAMES, **STACKED_EXPERT_NAMES} if stacked_experts(has) else cls.NAMES


class Qwen3_5ForConditionalGeneration(TextOnly, Qwen3_5ForCausalLM):
    """Qwen3.5 as released, served as its language model (shard/models/text_only.py)."""


class Qwen3_5MoeForConditionalGeneration(TextOnly, Qwen3_5MoeForCausalLM):
    """Qwen3.5-MoE as released, served as its language model."""


class Qwen3NextForCausalLM(Qwen3_5MoeForCausalLM):
    """Qwen3-Next: Qwen3.5-MoE's layers with linear attention's projections fused by key head
    (in_proj_qkvz, in_proj_ba), and Qwen2-MoE's sparse-layer fields (norm_topk_prob,
    decoder_sparse_step, mlp_only_layers)."""

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = qwen3_5_config(raw, config)
        assert config.linear_attention is not None
        fused = replace(config.linear_attention, projections="grouped")
        config = qwen_moe_config(raw, replace(config, linear_attention=fused), shared=True)
        if config.moe is None:
            return config
        renormalize = bool(raw.get("norm_topk_prob", True))  # transformers' default
        return replace(config, moe=replace(config.moe, renormalize=renormalize))
