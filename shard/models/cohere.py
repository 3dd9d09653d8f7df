"""Cohere's Command models: Command R and Aya (CohereForCausalLM) and Command R7B and Command A
(Cohere2ForCausalLM). One LayerNorm a layer (no bias) whose output attention and the SwiGLU MLP
both read, their outputs added to the stream together; rotary in interleaved pairs; tied
embeddings; the logits multiplied by `logit_scale`. Cohere 2 slides its window in three layers
of four (layer_types) and rotates only in those: its full-attention layers have no position
encoding. Command A+ (Cohere2MoeForCausalLM) adds Mixture-of-Experts MLPs after a dense
prefix."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, MoeConfig, UnsupportedArchitectureError
from shard.models.glm4_moe import GLM4_MOE_NAMES
from shard.models.names import QWEN_MOE_NAMES, STACKED_EXPERT_NAMES, stacked_experts
from shard.models.qwen2_moe import experts_per_token
from shard.weights import Weights

# the shared experts as one MLP under `mlp.shared_experts` (DeepSeek's names)
SHARED_EXPERTS_NAMES = {
    key: GLM4_MOE_NAMES[key] for key in ("shared_expert_gate_up_proj", "shared_expert_down_proj")
}


def cohere_config(raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
    """What both generations state alike."""
    return replace(
        config,
        norm="layer",
        rms_norm_eps=float(raw.get("layer_norm_eps", 1e-5)),
        parallel_block=True,
        logits_scale=float(raw.get("logit_scale", 1.0)),
        rope=replace(config.rope, interleaved=True),
    )


class CohereForCausalLM(DecoderModel):
    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("use_qk_norm"):
            # Command R+ (2024): a LayerNorm per head of q and k, weights [heads, head_dim]
            raise UnsupportedArchitectureError(
                "use_qk_norm=true (Command R+'s per-head q/k LayerNorms) is not supported"
            )
        return cohere_config(raw, config)


class Cohere2ForCausalLM(DecoderModel):
    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = cohere_config(raw, config)
        # the sliding layers rotate; the full ones attend without position encoding
        layer_types = raw.get("layer_types") or ()
        rotary = tuple(kind == "sliding_attention" for kind in layer_types)
        return replace(config, rotary_layers=rotary)


def cohere2_moe(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
    """Command A+'s experts: the top k router logits (in the model's dtype), weighted by their
    softmax (`expert_selection_fn` "softmax") or by their sigmoids, renormalised where
    `norm_topk_prob` says ("sigmoid"), rounded to the model's dtype; `num_shared_experts`
    shared SwiGLU experts as one MLP, summed with the routed output or averaged with it
    (`shared_expert_combination_strategy`)."""
    selection = raw.get("expert_selection_fn", "softmax")
    if selection not in ("softmax", "sigmoid"):
        raise UnsupportedArchitectureError(
            f"expert_selection_fn = {selection!r} is not supported (softmax, sigmoid)"
        )
    combination = raw.get("shared_expert_combination_strategy", "average")
    if combination not in ("sum", "average"):
        raise UnsupportedArchitectureError(
            f"shared_expert_combination_strategy = {combination!r} is not supported (sum, average)"
        )
    kinds = raw.get("mlp_layer_types") or ["sparse"] * config.num_layers
    experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
    sigmoid = selection == "sigmoid"
    return MoeConfig(
        num_experts=experts,
        top_k=experts_per_token(raw, experts),
        intermediate_size=config.intermediate_size,
        # softmax over the top k is softmax over all, renormalised over the top k
        renormalize=bool(raw.get("norm_topk_prob", True)) or not sigmoid,
        round_weights=True,
        sparse_layers=tuple(kind == "sparse" for kind in kinds),
        shared_expert_intermediate_size=config.intermediate_size
        * int(raw.get("num_shared_experts") or 0),
        shared_expert_gated=False,
        shared_expert_averaged=combination == "average",
        scoring="top_sigmoid" if sigmoid else "softmax",
    )


class Cohere2MoeForCausalLM(Cohere2ForCausalLM):
    """Command A+ (`Cohere2MoeForCausalLM`): Command A's parallel layer (RMSNorms where the
    config gives rms_norm_eps, else Cohere's LayerNorms) with Mixture-of-Experts MLPs after the
    dense prefix (`mlp_layer_types`, each dense MLP `prefix_dense_intermediate_size` wide); the
    prefix's full-attention layers rotate when `prefix_dense_sliding_window_pattern` is 1."""

    NAMES = {**QWEN_MOE_NAMES, **SHARED_EXPERTS_NAMES}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = super().adapt_config(raw, config)
        kinds = raw.get("layer_types") or ()
        dense = [kind == "dense" for kind in raw.get("mlp_layer_types") or ()]
        forced = raw.get("prefix_dense_sliding_window_pattern", 1) == 1
        rotary = tuple(
            kind == "sliding_attention" or (forced and i < len(dense) and dense[i])
            for i, kind in enumerate(kinds)
        )
        moe = cohere2_moe(raw, config)
        if raw.get("rms_norm_eps") is not None:
            config = replace(config, norm="rms", rms_norm_eps=float(raw["rms_norm_eps"]))
        prefix = raw.get("prefix_dense_intermediate_size")
        return replace(
            config,
            rotary_layers=rotary,
            moe=moe,
            intermediate_size=int(prefix) if prefix else config.intermediate_size,
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        return {**cls.NAMES, **STACKED_EXPERT_NAMES} if stacked_experts(weights.has) else cls.NAMES
