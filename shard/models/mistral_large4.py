"""Mistral Large 4 (`MistralLarge4ForConditionalGeneration`, served text only): DeepSeek Sparse
Attention's latent attention without a query bottleneck (one q_proj), in which
- every fourth layer has no position encoding (`no_rope_layers`): its whole query head is
  "nope" and its latent no rotary key part (MlaConfig.nope_layers), its indexer unrotated;
- each head's query is scaled by s_h log(p + 1) + b_h (shard/layers/head_position_scale.py),
  the indexer's queries likewise;
- the indexer's queries come from the layer's input through a LayerNorm of their own, and turn
  interleaved pairs as the attention's do;
- the rotary frequencies are times exp(alpha), learned (LeRoPE: `lerope.alpha`);
then Mistral 4's router (softmax in float32, groups ranked by their two best, renormalised,
times routed_scaling_factor) over experts beside shared ones, after dense first layers, and
the final logits soft-capped. The checkpoints are in Mistral's own layout (`layers.0.attention.
wq`, `feed_forward.w1`, `experts.0.w1` ...), beside a Pixtral tower and projector that are never
run. Layers reading another's latent cache (`kv_source_layers`) are refused."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from shard.layers.rotary import RotaryEmbedding
from shard.models.config import IndexerConfig, ModelConfig, UnsupportedArchitectureError
from shard.models.deepseek import DeepseekV3ForCausalLM, shared_indexer_layers
from shard.models.glm4_moe import deepseek_moe, listed_sparse_layers
from shard.models.text_only import text_config
from shard.weights import Weights

_LAYER = "layers.{i}."
_ATTENTION = _LAYER + "attention."
_INDEXER = _ATTENTION + "indexer."
MISTRAL_LARGE4_NAMES: dict[str, tuple[str, ...]] = {
    "embed_tokens": ("tok_embeddings",),
    "norm": ("norm",),
    "lm_head": ("output",),
    "input_layernorm": (_LAYER + "attention_norm",),
    "post_attention_layernorm": (_LAYER + "ffn_norm",),
    "q_proj": (_ATTENTION + "wq",),
    "kv_a_proj": (_ATTENTION + "wkv_a_with_mqa",),
    "kv_a_layernorm": (_ATTENTION + "kv_a_norm",),
    "kv_b_proj": (_ATTENTION + "wkv_b",),
    "o_proj": (_ATTENTION + "wo",),
    "head_position_scale": (_ATTENTION + "ssmax_scaling",),
    "indexer_wq_b": (_INDEXER + "wq_b",),
    "indexer_wk": (_INDEXER + "wk",),
    "indexer_k_norm": (_INDEXER + "k_norm",),
    "indexer_q_norm": (_INDEXER + "q_input_norm",),
    "indexer_weights_proj": (_INDEXER + "weights_proj",),
    "indexer_head_position_scale": (_INDEXER + "ssmax_scaling",),
    "gate_up_proj": (_LAYER + "feed_forward.w1", _LAYER + "feed_forward.w3"),
    "down_proj": (_LAYER + "feed_forward.w2",),
    "router": (_LAYER + "gate",),
    "expert_gate_up": (_LAYER + "experts.{{e}}.w1", _LAYER + "experts.{{e}}.w3"),
    "expert_down": (_LAYER + "experts.{{e}}.w2",),
    "shared_expert_gate_up_proj": (_LAYER + "shared_experts.w1", _LAYER + "shared_experts.w3"),
    "shared_expert_down_proj": (_LAYER + "shared_experts.w2",),
}
_LEROPE = "lerope.alpha"
# the Pixtral tower and its projector, and the multi-token-prediction head: never run
_NOT_RUN = ("vision_encoder.", "patch_merger.", "pre_mm_projector_norm.",
            "vision_language_adapter.", "mtp_dspark.")  # fmt: skip


def _flags(raw: dict[str, Any], field: str, layers: int, default: list[int]) -> list[int]:
    values = raw.get(field)
    values = default if values is None else values
    if len(values) != layers:
        raise UnsupportedArchitectureError(f"{field} = {values} must name each of {layers} layers")
    return list(values)


class MistralLarge4ForConditionalGeneration(DeepseekV3ForCausalLM):
    NAMES = MISTRAL_LARGE4_NAMES
    SKIPS_MTP_LAYERS = False

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **fields: Any) -> ModelConfig:
        return super().config_from_dict(text_config(raw), **fields)

    @staticmethod
    def router(raw: dict[str, Any], config: ModelConfig):  # type: ignore[override]
        moe = deepseek_moe(
            raw, config, group_score="top2", float32_router=True, renormalize=True
        )  # (its router always renormalises: the config has no norm_topk_prob)
        return listed_sparse_layers(raw, config, moe)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = super().adapt_config(raw, config)
        layers = config.num_layers
        sources = _flags(raw, "kv_source_layers", layers, list(range(layers)))
        if sources != list(range(layers)):
            raise UnsupportedArchitectureError(
                f"kv_source_layers = {sources}: layers reading another layer's latent cache are "
                "not supported"
            )
        rotating = [bool(x) for x in _flags(raw, "no_rope_layers", layers, [1] * layers)]
        assert config.mla is not None
        indexer = IndexerConfig(
            num_heads=int(raw.get("index_n_heads", 32)),
            head_dim=int(raw.get("index_head_dim", 128)),
            top_k=int(raw.get("index_topk", 2048)),
            rope_interleaved=True,
            shared_layers=shared_indexer_layers(raw, layers),
            query_norm=True,
        )
        mla = replace(
            config.mla,
            indexer=indexer,
            nope_layers=tuple(not r for r in rotating) if not all(rotating) else (),
            head_position_scale=True,
            latent_norm_eps=None,  # (its kv_a norm's is rms_norm_eps)
        )
        return replace(
            config,
            mla=mla,
            rotary_layers=tuple(rotating),
            final_softcap=raw.get("final_logit_softcapping") or None,
        )

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        weights.skip_modules(_NOT_RUN)
        super().__init__(config, weights, attention)
        # LeRoPE: the (one) rotary table's frequencies times exp(alpha), in float32
        alpha = weights.get_tensor(_LEROPE, stored_dtype=True).float()
        tables = {id(r): r for r in (getattr(m, "rotary", None) for m in self.mixers)}
        for rotary in tables.values():
            if isinstance(rotary, RotaryEmbedding):
                rotary.scale_frequencies(torch.exp(alpha))
