"""MiMo-V2-Flash (Xiaomi, `MiMoV2FlashForCausalLM`): sliding-window layers (five in six, a
128-token window) beside full ones, each kind with its own rope base and a third of each head
rotated; the sliding layers with twice the KV heads and a learned sink logit per head. Values
are narrower than queries and keys (v_head_dim 128 under head_dim 192) and scaled by
`attention_value_scale` after their projection. After a dense first layer (`mlp_layer_types`),
DeepSeek-V3's router (float32 sigmoid scores, a correction bias in the choice, groups) over
experts without a shared one. The multi-token-prediction layers (`model.mtp.`) are not run."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.glm4_moe import GLM4_MOE_NAMES, grouped_sigmoid_moe, listed_sparse_layers
from shard.models.names import STACKED_EXPERT_NAMES, in_some_layer, stacked_experts
from shard.weights import Weights

MIMO_NAMES = {**GLM4_MOE_NAMES, "sinks": ("model.layers.{i}.self_attn.attention_sink_bias",)}
_MODULE_SINKS = "model.layers.{i}.self_attn.sinks"  # transformers' module name
_MTP = ("model.mtp.",)


def _layer_types(raw: dict[str, Any], num_layers: int) -> list[str]:
    kinds = raw.get("layer_types") or [
        "full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention"
        for i in range(num_layers)
    ]
    if set(kinds) - {"full_attention", "sliding_attention"}:
        raise UnsupportedArchitectureError(f"layer_types {sorted(set(kinds))} are not supported")
    return kinds


class MiMoV2FlashForCausalLM(DecoderModel):
    NAMES = MIMO_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("n_shared_experts"):
            raise UnsupportedArchitectureError("MiMo-V2-Flash with shared experts is not defined")
        kinds = _layer_types(raw, config.num_layers)
        sliding = tuple(kind == "sliding_attention" for kind in kinds)
        kv_heads = config.num_kv_heads
        value_head_dim = int(raw.get("v_head_dim") or config.head_dim)
        if value_head_dim > config.head_dim:
            raise UnsupportedArchitectureError(
                f"v_head_dim {value_head_dim} above head_dim {config.head_dim} is not supported"
            )
        scale = raw.get("attention_value_scale")
        moe = listed_sparse_layers(raw, config, grouped_sigmoid_moe(raw, config))
        return replace(
            config,
            layer_attention_shapes=tuple(
                (2 * kv_heads if s else kv_heads, config.head_dim) for s in sliding
            ),
            attention_sinks=True,
            sink_layers=sliding,
            value_head_dim=value_head_dim,
            value_scale=None if scale is None else float(scale),
            o_bias=False,
            moe=moe,
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        table = cls.NAMES
        if in_some_layer(weights.has, _MODULE_SINKS):
            table = {**table, "sinks": (_MODULE_SINKS,)}
        return {**table, **STACKED_EXPERT_NAMES} if stacked_experts(weights.has) else table

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        weights.skip_modules(_MTP)
        super().__init__(config, weights, attention)
