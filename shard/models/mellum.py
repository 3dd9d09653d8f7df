"""JetBrains' Mellum 2 (`MellumForCausalLM`): Qwen3-MoE's attention and experts (per-head q/k
norms; the softmax top k, renormalised with `norm_topk_prob`, no shared expert) laid out as
Laguna's layers are: a sliding window in the layers `layer_types` names sliding, each layer type
its own rope, and dense or sparse MLPs as `mlp_layer_types` lists them (every one sparse by
default). The checkpoints' multi-token-prediction layer (`mtp.`), which transformers leaves out
too, is skipped."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.glm4_moe import listed_sparse_layers
from shard.models.qwen3_moe import Qwen3MoeForCausalLM
from shard.weights import Weights

_MTP = ("mtp.", "model.mtp.")


class MellumForCausalLM(Qwen3MoeForCausalLM):
    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = super().adapt_config(raw, config)
        for layer in range(config.num_layers):
            if config.rope_of(layer).partial_rotary_factor != 1.0:
                # (its rotary tables would be partial, but its attention rotates whole heads:
                # transformers cannot run such a config, so nothing says what it means)
                raise UnsupportedArchitectureError(
                    "partial_rotary_factor is not supported for Mellum: it rotates whole heads"
                )
        if config.moe is None:
            return config
        return replace(config, moe=listed_sparse_layers(raw, config, config.moe))

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        weights.skip_modules(_MTP)
        super().__init__(config, weights, attention)
