"""Liquid AI's LFM2 (`Lfm2ForCausalLM`: LFM2-350M to -2.6B): gated short convolutions
(shard/models/short_conv.py) in the layers `layer_types` names "conv", GQA softmax attention
with per-head q/k RMSNorms (before the rotary, as Qwen3's) in the others; SwiGLU MLPs
(w1, w3, w2) whose width transformers derives from the config (`block_auto_adjust_ff_dim`);
LFM2's names for the norms (operator_norm, ffn_norm, and embedding_norm for the final one) and
its `norm_eps`. The conv layers keep a state per sequence (no prefix caching or speculation,
as for the other recurrent models).

LFM2-MoE (`Lfm2MoeForCausalLM`: LFM2-8B-A1B): the same layers, Mixture-of-Experts MLPs after the
first `num_dense_layers` (dense ones intermediate_size wide, as given): sigmoid scores chosen
with a per-expert bias (`use_expert_bias`), the top k renormalised (the sum plus 1e-6) and
times `routed_scaling_factor`; the experts' w1, w3, w2 per expert as released, or stacked as
transformers 5 holds them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import (
    ModelConfig,
    MoeConfig,
    ShortConvConfig,
    UnsupportedArchitectureError,
)
from shard.models.names import LLAMA_NAMES, stacked_experts
from shard.models.qwen2_moe import experts_per_token
from shard.models.short_conv import SHORT_CONV_NAMES
from shard.weights import Weights

LFM2_NAMES = {
    **LLAMA_NAMES,
    **SHORT_CONV_NAMES,
    "norm": ("model.embedding_norm",),
    "input_layernorm": ("model.layers.{i}.operator_norm",),
    "post_attention_layernorm": ("model.layers.{i}.ffn_norm",),
    "o_proj": ("model.layers.{i}.self_attn.out_proj",),
    "q_norm": ("model.layers.{i}.self_attn.q_layernorm",),
    "k_norm": ("model.layers.{i}.self_attn.k_layernorm",),
    "gate_up_proj": ("model.layers.{i}.feed_forward.w1", "model.layers.{i}.feed_forward.w3"),
    "down_proj": ("model.layers.{i}.feed_forward.w2",),
}
_KINDS = ("conv", "full_attention")
LFM2_MOE_NAMES = {
    **LFM2_NAMES,
    "router": ("model.layers.{i}.feed_forward.gate",),
    "router_correction_bias": ("model.layers.{i}.feed_forward.expert_bias",),
    "expert_gate_up": (
        "model.layers.{i}.feed_forward.experts.{{e}}.w1",
        "model.layers.{i}.feed_forward.experts.{{e}}.w3",
    ),
    "expert_down": ("model.layers.{i}.feed_forward.experts.{{e}}.w2",),
}
# transformers 5's own layout of the experts
_STACKED = {
    "expert_gate_up": ("model.layers.{i}.feed_forward.experts.gate_up_proj",),
    "expert_down": ("model.layers.{i}.feed_forward.experts.down_proj",),
}


def mlp_width(raw: dict[str, Any]) -> int:
    """The MLP's width as transformers' Lfm2MLP derives it: with `block_auto_adjust_ff_dim`, two
    thirds of intermediate_size, times `block_ffn_dim_multiplier`, rounded up to a multiple of
    `block_multiple_of`."""
    width = int(raw["intermediate_size"])
    if raw.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = raw.get("block_ffn_dim_multiplier")
        if multiplier is not None:
            width = int(multiplier * width)
            multiple = int(raw.get("block_multiple_of", 256))
            width = multiple * ((width + multiple - 1) // multiple)
    return width


def short_conv_config(raw: dict[str, Any], num_layers: int) -> ShortConvConfig:
    kinds = raw.get("layer_types")
    if kinds is None or len(kinds) != num_layers or not set(kinds) <= set(_KINDS):
        raise UnsupportedArchitectureError(
            f"layer_types = {kinds} must name each of the {num_layers} layers one of {_KINDS}"
        )
    kernel = int(raw.get("conv_L_cache", 3))
    if kernel < 1:
        raise UnsupportedArchitectureError(f"conv_L_cache = {kernel} must be positive")
    return ShortConvConfig(
        layers=tuple(kind == "conv" for kind in kinds),
        kernel=kernel,
        bias=bool(raw.get("conv_bias", False)),
    )


class Lfm2ForCausalLM(DecoderModel):
    NAMES = LFM2_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(
            config,
            rms_norm_eps=float(raw.get("norm_eps", 1e-5)),
            intermediate_size=mlp_width(raw),
            short_conv=short_conv_config(raw, config.num_layers),
        )


def lfm2_moe(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
    experts = int(raw.get("num_experts") or 0)
    dense = int(raw.get("num_dense_layers") or 0)
    return MoeConfig(
        num_experts=experts,
        top_k=experts_per_token(raw, experts),
        intermediate_size=raw["moe_intermediate_size"],
        renormalize=bool(raw.get("norm_topk_prob", True)),
        round_weights=False,
        sparse_layers=tuple(i >= dense for i in range(config.num_layers)),
        scoring="sigmoid",
        routed_scaling=float(raw.get("routed_scaling_factor") or 1.0),
        correction_bias=bool(raw.get("use_expert_bias", True)),
        renormalize_eps=1e-6,
    )


class Lfm2MoeForCausalLM(Lfm2ForCausalLM):
    NAMES = LFM2_MOE_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = super().adapt_config(raw, config)
        # the dense layers' MLPs are intermediate_size wide, not derived from it
        return replace(
            config, intermediate_size=int(raw["intermediate_size"]), moe=lfm2_moe(raw, config)
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        def has(name: str) -> bool:
            return weights.has(name.replace("mlp.experts", "feed_forward.experts"))

        return {**cls.NAMES, **_STACKED} if stacked_experts(has) else cls.NAMES
