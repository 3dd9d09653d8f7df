"""GLM-4.5 and GLM-4.6 (`Glm4MoeForCausalLM`): GQA attention with q/k/v biases (o_proj without),
rotary over half of each head, optional per-head q/k norms (`use_qk_norm`); Mixture-of-Experts
MLPs after the first `first_k_dense_replace` dense layers, routed as DeepSeek-V3 routes: sigmoid
scores, a per-expert correction bias in the choice only, the best `topk_group` of `n_group`
expert groups, the weights renormalised (`norm_topk_prob`) and scaled by
`routed_scaling_factor`; `n_shared_experts` shared experts as one ungated MLP every token takes.

GLM-4.5V and GLM-4.6V (`Glm4vMoeForConditionalGeneration`) as released are served as this
language model, text only (shard/models/text_only.py): their multimodal rope (mrope_section)
turns every section by the same position for text, which is GLM-4.5's rope.

The released checkpoints also hold the multi-token-prediction layer(s) after the last layer
(`model.layers.{num_hidden_layers}...`), which transformers leaves out too: skipped."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, MoeConfig, UnsupportedArchitectureError
from shard.models.names import QWEN_MOE_NAMES, STACKED_EXPERT_NAMES, stacked_experts
from shard.models.qwen2_moe import experts_per_token
from shard.models.text_only import TextOnly, holds, text_config
from shard.weights import Weights

GLM4_MOE_NAMES = {
    **QWEN_MOE_NAMES,
    "shared_expert_gate_up_proj": (
        "model.layers.{i}.mlp.shared_experts.gate_proj",
        "model.layers.{i}.mlp.shared_experts.up_proj",
    ),
    "shared_expert_down_proj": ("model.layers.{i}.mlp.shared_experts.down_proj",),
    "router_correction_bias": ("model.layers.{i}.mlp.gate.e_score_correction_bias",),
}


def grouped_top_k(raw: dict[str, Any], experts: int, groups: int, top_groups: int) -> int:
    """num_experts_per_tok, for a router choosing within the best `top_groups` of `groups`
    equal groups of `experts`; raises naming the field of a config it cannot serve."""
    if experts < 1 or experts % groups:
        raise UnsupportedArchitectureError(
            f"n_routed_experts = {experts} must be a positive multiple of n_group = {groups}"
        )
    if not 1 <= top_groups <= groups:
        raise UnsupportedArchitectureError(
            f"topk_group = {top_groups} must be between 1 and n_group = {groups}"
        )
    top_k = experts_per_token(raw, experts)
    if top_k > top_groups * (experts // groups):
        raise UnsupportedArchitectureError(
            f"num_experts_per_tok = {top_k} is more than the {top_groups} kept groups of "
            f"{experts // groups} experts hold"
        )
    return top_k


def deepseek_moe(
    raw: dict[str, Any],
    config: ModelConfig,
    *,
    groups: int | None = None,
    top_groups: int | None = None,
    **options: Any,
) -> MoeConfig:
    """The Mixture-of-Experts layout DeepSeek's configs state (and GLM-4.5's, Mistral 4's):
    n_routed_experts experts of moe_intermediate_size after the first first_k_dense_replace dense
    layers, chosen within `top_groups` of `groups` expert groups, routed_scaling_factor, and
    n_shared_experts shared experts as one ungated MLP; the experts' outputs weighted in float32
    as transformers weights them. The groups are n_group and topk_group unless given;
    `renormalize` is norm_topk_prob (true when absent) unless given. `options`: the router's own
    MoeConfig fields."""
    groups = int(raw.get("n_group") or 1) if groups is None else groups
    top_groups = int(raw.get("topk_group") or 1) if top_groups is None else top_groups
    options.setdefault("renormalize", bool(raw.get("norm_topk_prob", True)))
    experts = int(
        raw.get("n_routed_experts") or raw.get("num_local_experts") or raw.get("num_experts") or 0
    )
    top_k = grouped_top_k(raw, experts, groups, top_groups)
    if options.get("scoring") == "sigmoid" or options.get("group_score") == "top2":
        if groups > 1 and experts // groups < 2:
            raise UnsupportedArchitectureError(
                f"each of the n_group = {groups} groups needs 2 experts: a group scores by its "
                "best two"
            )
    dense = int(raw.get("first_k_dense_replace") or 0)
    return MoeConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=raw["moe_intermediate_size"],
        round_weights=False,
        sparse_layers=tuple(i >= dense for i in range(config.num_layers)),
        shared_expert_intermediate_size=raw["moe_intermediate_size"]
        * int(raw.get("n_shared_experts") or 0),
        num_groups=groups,
        top_groups=top_groups,
        routed_scaling=float(raw.get("routed_scaling_factor") or 1.0),
        shared_expert_gated=False,
        **options,
    )


def grouped_sigmoid_moe(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
    """DeepSeek-V3's router: sigmoid scores, a correction bias in the choice, in float32."""
    return deepseek_moe(raw, config, scoring="sigmoid", float32_router=True, correction_bias=True)


def listed_sparse_layers(raw: dict[str, Any], config: ModelConfig, moe: MoeConfig) -> MoeConfig:
    """`moe` with its sparse layers as `mlp_layer_types` lists them, where the config has the
    list (GLM-4.7-Flash, K-EXAONE)."""
    kinds = raw.get("mlp_layer_types")
    if kinds is None:
        return moe
    if len(kinds) != config.num_layers or not set(kinds) <= {"dense", "sparse"}:
        raise UnsupportedArchitectureError(
            f"mlp_layer_types = {kinds} must name each of the {config.num_layers} layers "
            "'dense' or 'sparse'"
        )
    return replace(moe, sparse_layers=tuple(kind == "sparse" for kind in kinds))


class Glm4MoeForCausalLM(DecoderModel):
    NAMES = GLM4_MOE_NAMES
    SKIPS_MTP_LAYERS = True

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(
            config,
            o_bias=False,
            qk_norm=bool(raw.get("use_qk_norm", False)),
            moe=grouped_sigmoid_moe(raw, config),
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        # (in the language model's own names or nested in a vision-language checkpoint's)
        has = partial(holds, weights)
        return {**cls.NAMES, **STACKED_EXPERT_NAMES} if stacked_experts(has) else cls.NAMES


class Glm4vMoeForConditionalGeneration(TextOnly, Glm4MoeForCausalLM):
    """GLM-4.5V, GLM-4.6V: served as their language model."""


class Glm46VForConditionalGeneration:
    """GLM-4.6V's own wrapper class (`Glm46VForConditionalGeneration`): the language model
    inside is GLM-4's (text_config.model_type glm4v_text, GLM-4.6V-Flash's shape) or GLM-4.5's
    (glm4v_moe_text): served, text only, as Glm4vForConditionalGeneration or
    Glm4vMoeForConditionalGeneration serves it."""

    @staticmethod
    def _served(moe: bool) -> type[DecoderModel]:
        from shard.models.glm4 import Glm4vForConditionalGeneration

        return Glm4vMoeForConditionalGeneration if moe else Glm4vForConditionalGeneration

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **fields: Any) -> ModelConfig:
        kind = text_config(raw).get("model_type")
        if kind not in ("glm4v_text", "glm4v_moe_text"):
            raise UnsupportedArchitectureError(
                f"Glm46VForConditionalGeneration with a {kind!r} language model "
                "(text_config.model_type) is not supported; glm4v_text or glm4v_moe_text is"
            )
        return cls._served(kind == "glm4v_moe_text").config_from_dict(raw, **fields)

    def __new__(  # type: ignore[misc]
        cls, config: ModelConfig, weights: Weights, attention: str = "torch"
    ) -> DecoderModel:
        return cls._served(config.moe is not None)(config, weights, attention)
