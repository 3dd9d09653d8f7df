"""Tencent Hunyuan dense and MoE (`HunYuanDenseV1ForCausalLM`, `HunYuanMoEV1ForCausalLM`, as
transformers defines them): Llama's layers with per-head q/k norms applied to the rotated q and k
(`query_layernorm`, `key_layernorm`), and the checkpoints' "dynamic" rope with a fixed `alpha`,
which only stretches the base (theta * alpha ** (d / (d - 2)), static: served as the default
rope on that base). The MoE model's MLP in every layer: a float32 softmax router (`gate.wg`),
the top k renormalised, experts and one shared MLP every token takes (each intermediate_size
wide), added ungated. A per-layer list of expert counts or top-k is refused unless uniform."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, MoeConfig, UnsupportedArchitectureError
from shard.models.names import LLAMA_NAMES, QWEN_MOE_NAMES, STACKED_EXPERT_NAMES, stacked_experts
from shard.models.qwen2_moe import experts_per_token
from shard.weights import Weights

HUNYUAN_NAMES = {
    **LLAMA_NAMES,
    "q_norm": ("model.layers.{i}.self_attn.query_layernorm",),
    "k_norm": ("model.layers.{i}.self_attn.key_layernorm",),
}
HUNYUAN_MOE_NAMES = {
    **HUNYUAN_NAMES,
    **{k: QWEN_MOE_NAMES[k] for k in ("expert_gate_up", "expert_down")},
    "router": ("model.layers.{i}.mlp.gate.wg",),
    "shared_expert_gate_up_proj": (
        "model.layers.{i}.mlp.shared_mlp.gate_proj",
        "model.layers.{i}.mlp.shared_mlp.up_proj",
    ),
    "shared_expert_down_proj": ("model.layers.{i}.mlp.shared_mlp.down_proj",),
}


def alpha_as_base(raw: dict[str, Any]) -> dict[str, Any]:
    """The config with a fixed-alpha "dynamic" rope stated as the default rope on its base."""
    params = raw.get("rope_parameters") or {}
    if params.get("rope_type") != "dynamic" or not params.get("alpha"):
        return raw
    dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    theta = float(params["rope_theta"]) * float(params["alpha"]) ** (dim / (dim - 2))
    return {**raw, "rope_parameters": {"rope_type": "default", "rope_theta": theta}}


class HunYuanDenseV1ForCausalLM(DecoderModel):
    NAMES = HUNYUAN_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **fields: Any) -> ModelConfig:
        return super().config_from_dict(alpha_as_base(raw), **fields)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(config, qk_norm_after_rope=True)


def _uniform(raw: dict[str, Any], field: str) -> Any:
    value = raw.get(field)
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise UnsupportedArchitectureError(f"{field} = {value}: differing per layer")
        return value[0]
    return value


class HunYuanMoEV1ForCausalLM(HunYuanDenseV1ForCausalLM):
    NAMES = HUNYUAN_MOE_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        experts = int(_uniform(raw, "num_experts") or 0)
        uniform = {**raw, "num_experts_per_tok": _uniform(raw, "moe_topk")}
        moe = MoeConfig(
            num_experts=experts,
            top_k=experts_per_token(uniform, experts),
            intermediate_size=config.intermediate_size,
            renormalize=True,
            round_weights=False,  # the weights stay in the router's float32
            sparse_layers=(True,) * config.num_layers,
            shared_expert_intermediate_size=config.intermediate_size,
            shared_expert_gated=False,
            float32_router=True,
        )
        return replace(super().adapt_config(raw, config), moe=moe)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if not stacked_experts(weights.has):
            return cls.NAMES
        return {**cls.NAMES, **STACKED_EXPERT_NAMES, "router": HUNYUAN_MOE_NAMES["router"]}
