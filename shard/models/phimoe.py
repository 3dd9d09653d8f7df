"""Phi-3.5-MoE (`PhimoeForCausalLM`): Phi-3.5's attention (separate q/k/v/o, with biases where
`attention_bias` says; longrope, its cos/sin scaled by the config's mscale, its frequencies the
short factors' at every length as transformers computes them) under LayerNorms with a bias,
Mixture-of-Experts MLPs in every layer under Mixtral's names (`block_sparse_moe`, experts
w1/w3/w2; transformers 5's own `mlp.router` and stacked experts too), routed by the
sparsemixer's top-2 (shard/layers/moe.py route_sparsemixer) in the model's dtype, and an LM
head with a bias (`lm_head_bias`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.mixtral import MIXTRAL_NAMES, experts_in_every_layer
from shard.models.names import in_some_layer
from shard.weights import Weights

_STACKED = {
    "router": ("model.layers.{i}.mlp.router",),
    "expert_gate_up": ("model.layers.{i}.mlp.experts.gate_up_proj",),
    "expert_down": ("model.layers.{i}.mlp.experts.down_proj",),
}


class PhimoeForCausalLM(DecoderModel):
    NAMES = MIXTRAL_NAMES

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if in_some_layer(weights.has, _STACKED["expert_down"][0]):
            return {**cls.NAMES, **_STACKED}
        return cls.NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("num_experts_per_tok", 2) != 2:
            raise UnsupportedArchitectureError(
                f"Phi-MoE's sparsemixer routes to 2 experts; num_experts_per_tok = "
                f"{raw.get('num_experts_per_tok')} is not supported"
            )
        moe = experts_in_every_layer(
            raw,
            config,
            scoring="sparsemixer",
            jitter_eps=float(raw.get("router_jitter_noise", 0.01)),
            renormalize=False,
            round_weights=True,  # the router computes in the model's dtype
        )
        rope = config.rope
        params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        short, long = params.get("short_mscale"), params.get("long_mscale")
        if short is not None or long is not None:
            if short != long:
                raise UnsupportedArchitectureError(
                    f"Phi-MoE with short_mscale {short} and long_mscale {long}: different "
                    "scales for the short and long rope tables are not supported"
                )
            rope = replace(rope, attention_factor=float(short))
        if rope.rope_type == "longrope":
            # transformers' PhimoeRotaryEmbedding builds its frequencies without the sequence
            # length, so from the short factors at every length (only the mscale switches, and
            # the releases' two are equal); served as it computes them
            rope = replace(rope, long_factor=rope.short_factor)
        return replace(
            config,
            moe=moe,
            rope=rope,
            norm="layer_bias",
            lm_head_bias=bool(raw.get("lm_head_bias", False)),
        )
