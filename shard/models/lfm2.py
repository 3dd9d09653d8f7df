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
from shard.models.names import LLAMA_NAMES, in_some_layer, stacked_experts
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


def short_conv_config(
    raw: dict[str, Any], num_layers: int, known: tuple[str, ...] = _KINDS
) -> ShortConvConfig:
    kinds = raw.get("layer_types")
    if kinds is None or len(kinds) != num_layers or not set(kinds) <= set(known):
        raise UnsupportedArchitectureError(
            f"layer_types = {kinds} must name each of the {num_layers} layers one of {known}"
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


LFM3_NAMES = {
    **LFM2_NAMES,
    "o_proj": ("model.layers.{i}.self_attn.o_proj",),
    "q_norm": ("model.layers.{i}.self_attn.q_norm",),
    "k_norm": ("model.layers.{i}.self_attn.k_norm",),
    # the Hub's name for it (transformers' module: g_proj)
    "attn_output_gate": ("model.layers.{i}.self_attn.gate_proj",),
    # the sandwich norms: after the mixer (operator) and after the MLP
    "post_attention_layernorm": ("model.layers.{i}.post_operator_norm",),
    "pre_feedforward_layernorm": ("model.layers.{i}.ffn_norm",),
    "post_feedforward_layernorm": ("model.layers.{i}.post_ffn_norm",),
}
_LFM3_KINDS = ("conv", "sliding_attention", "full_attention")
_MODULE_GATE = "model.layers.{i}.self_attn.g_proj"  # transformers' module name of the gate
# (a conv layer's rope and window, never used, read as a sliding layer's)
_CONV_AS = "sliding_attention"


class Lfm3ForCausalLM(Lfm2ForCausalLM):
    """Liquid AI's LFM3: LFM2's short convolutions beside attention layers that slide
    (`sliding_window`, their own rope) or attend in full (proportional rope), each head's output
    gated by a sigmoid of the layer's input (`use_attention_gate`: g_proj, one gate a head);
    sandwich norms after the mixer and the MLP (`use_sandwich_norm`); the MLP intermediate_size
    wide."""

    NAMES = LFM3_NAMES

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **kwargs: Any) -> ModelConfig:
        kinds = list(raw.get("layer_types") or [])
        shown = [_CONV_AS if kind == "conv" else kind for kind in kinds]
        return super().config_from_dict(
            {**raw, "layer_types": shown, "_lfm3_layer_types": kinds}, **kwargs
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if in_some_layer(weights.has, _MODULE_GATE + ".weight"):
            return {**cls.NAMES, "attn_output_gate": (_MODULE_GATE,)}
        return cls.NAMES

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        super().__init__(config, weights, attention)
        self._hub_gate = self.names_for(weights) is self.NAMES

    def adapter_module(self, name: str) -> str | None:
        """PEFT names the gate by transformers' module (g_proj): the Hub's files, gate_proj."""
        return name.replace(".self_attn.g_proj", ".self_attn.gate_proj") if self._hub_gate else name

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if not raw.get("use_sandwich_norm", True):
            raise UnsupportedArchitectureError("LFM3 with use_sandwich_norm false is not supported")
        kinds = {**raw, "layer_types": raw["_lfm3_layer_types"]}
        return replace(
            config,
            rms_norm_eps=float(raw.get("norm_eps", raw.get("rms_norm_eps", 1e-5))),
            intermediate_size=int(raw["intermediate_size"]),
            short_conv=short_conv_config(kinds, config.num_layers, _LFM3_KINDS),
            sandwich_norms=True,
            attention_output_gate=bool(raw.get("use_attention_gate", True)),
            attention_head_gate=True,
        )
