"""Lara Mini (Translated's Lara-4-Mini, `LaraMiniForCausalLM`): Qwen3.5's Gated DeltaNet in two
layers of five beside softmax attention (the other three: two sliding, which alone rotate, and
one full, without positions), per-head q/k norms, every MLP Flint's Mixture-of-Experts (the top
k of a float32 softmax, renormalised, beside a shared expert added ungated). Its norms scale in
float32, the gated output norm's too. The checkpoints fuse the linear layers' input projections
into one `in_proj` (rows [q | k | v | z | b | a]) and call the gated norm `out_norm`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.linear_attention import LINEAR_ATTENTION_NAMES
from shard.models.names import QWEN_MOE_NAMES, STACKED_EXPERT_NAMES, stacked_experts
from shard.models.qwen2_moe import qwen_moe_config
from shard.models.qwen3_5 import linear_attention_config
from shard.weights import Weights

_LINEAR = "model.layers.{i}.linear_attn."
LARA_NAMES = {
    **QWEN_MOE_NAMES,
    **LINEAR_ATTENTION_NAMES,
    "linear_in": (_LINEAR + "in_proj",),
    "linear_norm": (_LINEAR + "out_norm",),
}
# the released pattern, period five (transformers' default where a config leaves it out)
_PATTERN = ("linear_attention", "sliding_attention", "linear_attention", "full_attention",
            "sliding_attention")  # fmt: skip


class LaraMiniForCausalLM(DecoderModel):
    NAMES = LARA_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        kinds = raw.get("layer_types") or [
            _PATTERN[i % len(_PATTERN)] for i in range(config.num_layers)
        ]
        # windows by layer_types, as for every sliding model; linear attention by the same list
        linear = {**raw, "layer_types": ["full_attention" if k == "sliding_attention" else k
                                         for k in kinds]}  # fmt: skip
        cfg = linear_attention_config(linear, config.num_layers)
        config = qwen_moe_config(raw, config, shared=True)
        if config.moe is None or not all(config.moe.sparse_layers):
            raise UnsupportedArchitectureError(
                "Lara Mini's config must name experts for every layer"
            )
        moe = replace(
            config.moe,
            renormalize=bool(raw.get("norm_topk_prob", True)),
            float32_router=True,
            shared_expert_gated=False,
        )
        return replace(
            config,
            moe=moe,
            norm="fp32_rms",
            linear_attention=replace(cfg, projections="single", norm_in_float32=True),
            rotary_layers=tuple(kind == "sliding_attention" for kind in kinds),
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        return {**cls.NAMES, **STACKED_EXPERT_NAMES} if stacked_experts(weights.has) else cls.NAMES
