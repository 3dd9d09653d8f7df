"""Mixtral: Mistral's attention over Mixture-of-Experts MLPs in every layer: softmax over the
router's logits, the top k renormalised, the experts' outputs weighted in float32. The Hub's
checkpoints name the block `block_sparse_moe` and each expert's gate, down and up w1, w2, w3;
transformers 5 holds (and can save) them stacked under `mlp`; quantization tools split those
back into `mlp.experts.{e}.gate_proj` ... (names.PER_EXPERT_MLP_NAMES)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, MoeConfig
from shard.models.names import (
    LLAMA_NAMES,
    PER_EXPERT_MLP_NAMES,
    STACKED_EXPERT_NAMES,
    per_expert_under_mlp,
    stacked_experts,
)
from shard.models.qwen2_moe import experts_per_token
from shard.weights import Weights

MIXTRAL_NAMES = {
    **LLAMA_NAMES,
    "router": ("model.layers.{i}.block_sparse_moe.gate",),
    "expert_gate_up": (
        "model.layers.{i}.block_sparse_moe.experts.{{e}}.w1",
        "model.layers.{i}.block_sparse_moe.experts.{{e}}.w3",
    ),
    "expert_down": ("model.layers.{i}.block_sparse_moe.experts.{{e}}.w2",),
}


def experts_in_every_layer(raw: dict[str, Any], config: ModelConfig, **options: Any) -> MoeConfig:
    """Mixtral's shape, which gpt-oss shares: num_local_experts experts of intermediate_size in
    every layer, the top k renormalised; `options`: the MoeConfig fields that differ."""
    experts = raw["num_local_experts"]
    fields: dict[str, Any] = {
        "num_experts": experts,
        "top_k": experts_per_token(raw, experts),
        "intermediate_size": config.intermediate_size,
        "renormalize": True,
        "round_weights": False,
        "sparse_layers": (True,) * config.num_layers,
        **options,
    }
    return MoeConfig(**fields)


class MixtralForCausalLM(DecoderModel):
    NAMES = MIXTRAL_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(config, moe=experts_in_every_layer(raw, config))

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if stacked_experts(weights.has):
            return {**cls.NAMES, **STACKED_EXPERT_NAMES}
        if per_expert_under_mlp(weights.has_module):
            return {**cls.NAMES, **PER_EXPERT_MLP_NAMES}
        return cls.NAMES
