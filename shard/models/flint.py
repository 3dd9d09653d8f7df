"""Flint (`FlintForCausalLM`): Qwen3-MoE's attention (per-head q/k norms, no biases) with a
learned sink logit per head (gpt-oss's, the Hub's `softmax_offset`), windows in the layers
`layer_types` names sliding, which alone rotate (the full ones have no position encoding);
gpt-oss's float32 norms; after the dense `mlp_only_layers`, Mixture-of-Experts MLPs: the top k
of the float32 router logits' sigmoids, renormalised (`norm_topk_prob`), beside a shared SwiGLU
expert added ungated."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.names import QWEN_MOE_NAMES, STACKED_EXPERT_NAMES, in_some_layer, stacked_experts
from shard.models.qwen2_moe import qwen_moe_config
from shard.weights import Weights

FLINT_NAMES = {**QWEN_MOE_NAMES, "sinks": ("model.layers.{i}.self_attn.softmax_offset",)}
_MODULE_SINKS = "model.layers.{i}.self_attn.sinks"  # transformers' module name


class FlintForCausalLM(DecoderModel):
    NAMES = FLINT_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = qwen_moe_config(raw, config, shared=True)
        kinds = raw.get("layer_types") or ()
        if config.moe is not None:
            moe = replace(
                config.moe,
                renormalize=bool(raw.get("norm_topk_prob", True)),
                round_weights=False,  # float32 weights, as transformers multiplies them
                scoring="sigmoid",
                float32_router=True,
                shared_expert_gated=False,
            )
            config = replace(config, moe=moe)
        return replace(
            config,
            norm="fp32_rms",
            attention_sinks=True,
            rotary_layers=tuple(kind == "sliding_attention" for kind in kinds),
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        table = cls.NAMES
        if in_some_layer(weights.has, _MODULE_SINKS):
            table = {**table, "sinks": (_MODULE_SINKS,)}
        return {**table, **STACKED_EXPERT_NAMES} if stacked_experts(weights.has) else table
