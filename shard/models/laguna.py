"""Poolside's Laguna (`LagunaForCausalLM`): AFMoE-style attention in a two-norm layer, per-head
q/k norms, a sliding window in the layers `layer_types` names sliding, each layer type its own
rope (the full layers' over part of each head), a query-head count of each layer's own
(`num_attention_heads_per_layer`; the KV heads the same in every layer), and attention's
output times softplus(g_proj(x)) (in float32, rounded to the dtype), one gate a head or one a
head dim (`gating`). The MLPs are dense or Mixture-of-Experts as `mlp_layer_types` lists them
(by default the first dense): sigmoid scores of the router's logits, soft-capped where
`moe_router_logit_softcapping` says, chosen with a per-expert correction bias, the top k
renormalised and times `moe_routed_scaling_factor`, beside a shared SwiGLU expert added
ungated."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, MoeConfig, UnsupportedArchitectureError
from shard.models.glm4_moe import GLM4_MOE_NAMES, listed_sparse_layers
from shard.models.names import QWEN_MOE_NAMES, STACKED_EXPERT_NAMES, in_some_layer, stacked_experts
from shard.models.qwen2_moe import experts_per_token
from shard.weights import Weights

# the Hub's names: Qwen2-MoE's shared_expert and per-expert modules, the bias under experts
LAGUNA_NAMES = {
    **QWEN_MOE_NAMES,
    "attn_output_gate": ("model.layers.{i}.self_attn.g_proj",),
    "router_correction_bias": ("model.layers.{i}.mlp.experts.e_score_correction_bias",),
}
# transformers' own module names, where it saves them so (its conversion renames both): the
# shared expert's `shared_experts`, the bias under the router
_MODULE_BIAS = "model.layers.{i}.mlp.gate.e_score_correction_bias"
_MODULE_NAMES = {
    "router_correction_bias": (_MODULE_BIAS,),
    **{
        ours: GLM4_MOE_NAMES[ours]
        for ours in ("shared_expert_gate_up_proj", "shared_expert_down_proj")
    },
}
# `gating` -> whether each head has one gate (else one per head dim), as transformers reads it
_GATINGS = {True: True, "per-head": True, "per-element": False}


def layer_heads(raw: dict[str, Any], config: ModelConfig) -> tuple[int, ...]:
    """Each layer's query heads (num_attention_heads_per_layer, else num_attention_heads in
    every layer); raises naming the field where a layer's heads cannot share the KV heads."""
    heads = raw.get("num_attention_heads_per_layer") or [config.num_heads] * config.num_layers
    if len(heads) != config.num_layers:
        raise UnsupportedArchitectureError(
            f"num_attention_heads_per_layer names {len(heads)} layers, not {config.num_layers}"
        )
    kv_heads = config.num_kv_heads
    for layer, count in enumerate(heads):
        if not isinstance(count, int) or count < 1 or count % kv_heads:
            raise UnsupportedArchitectureError(
                f"num_attention_heads_per_layer[{layer}] = {count!r} must be a positive "
                f"multiple of num_key_value_heads = {kv_heads}"
            )
    return tuple(heads)


def laguna_moe(raw: dict[str, Any], config: ModelConfig) -> MoeConfig | None:
    """The experts of the layers `mlp_layer_types` makes sparse; None where none is."""
    if raw.get("moe_apply_router_weight_on_input"):
        raise UnsupportedArchitectureError(
            "moe_apply_router_weight_on_input = true is not supported (transformers refuses it "
            "too): Laguna's router weights the experts' outputs"
        )
    experts = int(raw.get("num_experts") or 0)
    default = MoeConfig(
        num_experts=experts,
        top_k=0,
        intermediate_size=int(raw.get("moe_intermediate_size") or 0),
        renormalize=True,
        round_weights=False,
        # transformers' default when the config lists none: the first layer dense
        sparse_layers=tuple(i > 0 for i in range(config.num_layers)),
    )
    moe = listed_sparse_layers(raw, config, default)
    if not any(moe.sparse_layers):
        return None
    return replace(
        moe,
        top_k=experts_per_token(raw, experts),
        shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size") or 0),
        shared_expert_gated=False,
        scoring="sigmoid",
        correction_bias=True,
        renormalize_eps=0.0,  # transformers divides by the sum as it is
        routed_scaling=float(raw.get("moe_routed_scaling_factor") or 1.0),
        router_softcap=float(raw.get("moe_router_logit_softcapping") or 0.0),
    )


class LagunaForCausalLM(DecoderModel):
    NAMES = LAGUNA_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        gating = raw.get("gating", True)
        if not isinstance(gating, bool | str) or gating not in _GATINGS:
            raise UnsupportedArchitectureError(
                f"gating = {gating!r} is not supported: true or 'per-head' (a gate a head), or "
                "'per-element' (a gate a head dim)"
            )
        return replace(
            config,
            layer_heads=layer_heads(raw, config),
            attention_output_gate=True,
            attention_head_gate=_GATINGS[gating],
            attention_gate_activation="softplus",
            moe=laguna_moe(raw, config),
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        table = cls.NAMES
        if in_some_layer(weights.has, _MODULE_BIAS):
            table = {**table, **_MODULE_NAMES}
        return {**table, **STACKED_EXPERT_NAMES} if stacked_experts(weights.has) else table
