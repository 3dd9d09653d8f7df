"""DeepSeek-V2 and DeepSeek-V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`: also DeepSeek-R1,
Kimi K2 and Moonlight, which are V3 checkpoints), GLM-4.7-Flash (`Glm4MoeLiteForCausalLM`:
V3's layers, its dense and sparse layers listed by `mlp_layer_types`) and Youtu-LLM
(`YoutuForCausalLM`: V3's attention, every MLP dense), DeepSeek-V3.2 (`DeepseekV32ForCausalLM`:
V3 with DeepSeek Sparse Attention, shard/models/sparse_attention.py) and GLM-5
(`GlmMoeDsaForCausalLM`: V3.2's, its indexer's rotary pairs interleaved, some layers reusing
the choice of the layer before): multi-head latent
attention in every layer (shard/models/latent_attention.py), Mixture-of-Experts MLPs after the
first `first_k_dense_replace` dense ones, with `n_shared_experts` shared experts as one ungated
MLP.

Routers, as transformers computes them (the router kept in float32):
- V3: GLM-4.5's (shard/models/glm4_moe.py `grouped_sigmoid_moe`): sigmoid scores, a correction
  bias in the choice, the best `topk_group` of `n_group` groups, renormalised
  (`norm_topk_prob`), times `routed_scaling_factor`.
- V2: softmax probabilities, the top k of all experts (`topk_method` "greedy", V2-Lite) or of
  the `topk_group` groups with the highest best probability ("group_limited_greedy"), times
  `routed_scaling_factor`, never renormalised.

With YaRN (`mscale_all_dim`), the query scale is multiplied by yarn_mscale(factor,
mscale_all_dim)^2. V3's released checkpoints hold a multi-token-prediction layer after the
last: skipped."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from shard.layers.rotary import RopeConfig, yarn_mscale
from shard.models.blocks import DecoderModel
from shard.models.config import (
    IndexerConfig,
    MlaConfig,
    ModelConfig,
    MoeConfig,
    UnsupportedArchitectureError,
)
from shard.models.glm4_moe import (
    GLM4_MOE_NAMES,
    deepseek_moe,
    grouped_sigmoid_moe,
    listed_sparse_layers,
)
from shard.models.names import STACKED_EXPERT_NAMES, stacked_experts
from shard.models.text_only import TextOnly, holds
from shard.weights import Weights

DEEPSEEK_NAMES = {
    **GLM4_MOE_NAMES,
    "q_proj": ("model.layers.{i}.self_attn.q_proj",),
    "q_a_proj": ("model.layers.{i}.self_attn.q_a_proj",),
    "q_a_layernorm": ("model.layers.{i}.self_attn.q_a_layernorm",),
    "q_b_proj": ("model.layers.{i}.self_attn.q_b_proj",),
    "kv_a_proj": ("model.layers.{i}.self_attn.kv_a_proj_with_mqa",),
    "kv_a_layernorm": ("model.layers.{i}.self_attn.kv_a_layernorm",),
    "kv_b_proj": ("model.layers.{i}.self_attn.kv_b_proj",),
    # DeepSeek Sparse Attention's indexer (V3.2, GLM-5)
    "indexer_wq_b": ("model.layers.{i}.self_attn.indexer.wq_b",),
    "indexer_wk": ("model.layers.{i}.self_attn.indexer.wk",),
    "indexer_k_norm": ("model.layers.{i}.self_attn.indexer.k_norm",),
    "indexer_weights_proj": ("model.layers.{i}.self_attn.indexer.weights_proj",),
}


def mla_config(raw: dict[str, Any]) -> MlaConfig:
    q_lora_rank = raw.get("q_lora_rank")
    mla = MlaConfig(
        q_lora_rank=int(q_lora_rank) if q_lora_rank else None,
        kv_lora_rank=int(raw["kv_lora_rank"]),
        qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
        qk_rope_head_dim=int(raw["qk_rope_head_dim"]),
        v_head_dim=int(raw["v_head_dim"]),
    )
    for field in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
        if getattr(mla, field) < 1:
            raise UnsupportedArchitectureError(f"{field} = {getattr(mla, field)} must be positive")
    if mla.qk_rope_head_dim < 2 or mla.qk_rope_head_dim % 2:
        raise UnsupportedArchitectureError(
            f"qk_rope_head_dim = {mla.qk_rope_head_dim} must be a positive even number"
        )
    if raw.get("head_dim") not in (None, mla.qk_rope_head_dim):
        # transformers tabulates the rotary over head_dim (it sets it to qk_rope_head_dim)
        raise UnsupportedArchitectureError(
            f"head_dim = {raw['head_dim']} must equal qk_rope_head_dim = "
            f"{mla.qk_rope_head_dim}: the rotary tables are that wide"
        )
    return mla


def query_scale(raw: dict[str, Any], mla: MlaConfig) -> float:
    """(qk_nope + qk_rope)^-0.5, times yarn_mscale(factor, mscale_all_dim)^2 under YaRN."""
    scale = (mla.qk_nope_head_dim + mla.qk_rope_head_dim) ** -0.5
    rope = raw.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
        scale *= yarn_mscale(float(rope["factor"]), float(rope["mscale_all_dim"])) ** 2
    return scale


def grouped_softmax_moe(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
    """DeepSeek-V2's router."""
    method = raw.get("topk_method") or "greedy"
    if method not in ("greedy", "group_limited_greedy"):
        raise UnsupportedArchitectureError(
            f"topk_method = {method!r} is not served (greedy, group_limited_greedy)"
        )
    if raw.get("norm_topk_prob"):
        # transformers' DeepSeek-V2 never renormalises; DeepSeek's own code does, unscaled
        raise UnsupportedArchitectureError(
            "norm_topk_prob = true: transformers' DeepSeek-V2 ignores it and DeepSeek's code "
            "renormalises instead of scaling, so the model it means is ambiguous"
        )
    groups, top_groups = 1, 1
    if method == "group_limited_greedy":
        groups, top_groups = int(raw.get("n_group") or 1), int(raw.get("topk_group") or 1)
    return deepseek_moe(
        raw, config, groups=groups, top_groups=top_groups, renormalize=False, float32_router=True
    )


class DeepseekV3ForCausalLM(DecoderModel):
    NAMES = DEEPSEEK_NAMES
    SKIPS_MTP_LAYERS = True

    @staticmethod
    def router(raw: dict[str, Any], config: ModelConfig) -> MoeConfig | None:
        return grouped_sigmoid_moe(raw, config)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        mla = mla_config(raw)
        # the rotary tables are the rotary key part's width (GLM-4.7-Flash's config aliases
        # head_dim to it rather than stating it)
        rope = RopeConfig.from_config_dict(raw, mla.qk_rope_head_dim)
        # V2's complex rotation pairs neighbouring dims as V3's rope_interleave does
        rope = replace(rope, interleaved=bool(raw.get("rope_interleave", True)))
        if rope.rotary_dim != mla.qk_rope_head_dim:
            raise UnsupportedArchitectureError(
                f"partial_rotary_factor = {rope.partial_rotary_factor}: latent attention "
                f"rotates all qk_rope_head_dim = {mla.qk_rope_head_dim} dims"
            )
        return replace(
            config,
            head_dim=mla.qk_rope_head_dim,
            rope=rope,
            mla=mla,
            attention_scale=query_scale(raw, mla),
            moe=cls.router(raw, config),
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        # (in the language model's own names or nested in a vision-language checkpoint's)
        has = partial(holds, weights)
        return {**cls.NAMES, **STACKED_EXPERT_NAMES} if stacked_experts(has) else cls.NAMES


class DeepseekV2ForCausalLM(DeepseekV3ForCausalLM):
    SKIPS_MTP_LAYERS = False

    @staticmethod
    def router(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
        return grouped_softmax_moe(raw, config)


class YoutuForCausalLM(DeepseekV3ForCausalLM):
    """Youtu-LLM (Tencent): DeepSeek-V3's latent attention in Llama's layers, every MLP dense."""

    SKIPS_MTP_LAYERS = False

    @staticmethod
    def router(raw: dict[str, Any], config: ModelConfig) -> MoeConfig | None:
        return None


class Glm4MoeLiteForCausalLM(DeepseekV3ForCausalLM):
    """GLM-4.7-Flash: DeepSeek-V3's latent attention and router, its dense and sparse layers
    listed by `mlp_layer_types`."""

    @staticmethod
    def router(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
        return listed_sparse_layers(raw, config, grouped_sigmoid_moe(raw, config))


def indexer_config(
    raw: dict[str, Any], mla: MlaConfig, *, interleaved: bool, layers: int
) -> IndexerConfig:
    """DeepSeek Sparse Attention's indexer from index_n_heads, index_head_dim, index_topk (and
    GLM-5's shared layers, `indexer_types`); raises naming the field it cannot serve."""
    if mla.q_lora_rank is None:
        raise UnsupportedArchitectureError(
            "q_lora_rank is null: the sparse attention's indexer reads the queries' latent"
        )
    spec = IndexerConfig(
        num_heads=int(raw.get("index_n_heads", 64)),
        head_dim=int(raw.get("index_head_dim", 128)),
        top_k=int(raw.get("index_topk", 2048)),
        rope_interleaved=interleaved,
        shared_layers=shared_indexer_layers(raw, layers),
    )
    if spec.num_heads < 1 or spec.top_k < 1:
        raise UnsupportedArchitectureError(
            f"index_n_heads = {spec.num_heads} and index_topk = {spec.top_k} must be positive"
        )
    if spec.head_dim < mla.qk_rope_head_dim:
        raise UnsupportedArchitectureError(
            f"index_head_dim = {spec.head_dim} is narrower than the qk_rope_head_dim = "
            f"{mla.qk_rope_head_dim} dims its rotary turns"
        )
    return spec


def shared_indexer_layers(raw: dict[str, Any], layers: int) -> tuple[bool, ...]:
    """GLM-5's layers that reuse the choice of the layer before (`indexer_types` "shared"), as
    transformers derives them when the config lists none: from `index_topk_pattern` ("F"/"S"
    a layer) or every `index_topk_freq`-th layer from `index_skip_topk_offset` on running its
    own indexer. No such field: every layer runs its own."""
    kinds = raw.get("indexer_types")
    if kinds is None and (pattern := raw.get("index_topk_pattern")) is not None:
        letters = {"F": "full", "S": "shared"}
        kinds = [letters.get(c, c) for c in pattern] if isinstance(pattern, str) else pattern
    if kinds is None:
        freq = max(int(raw.get("index_topk_freq", 1)), 1)
        offset = int(raw.get("index_skip_topk_offset", 2))
        kinds = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    if len(kinds) != layers or not set(kinds) <= {"full", "shared"}:
        raise UnsupportedArchitectureError(
            f"indexer_types = {kinds} must name each of the {layers} layers 'full' or 'shared'"
        )
    if kinds and kinds[0] != "full":
        raise UnsupportedArchitectureError(
            "indexer_types: the first layer is 'shared', with no indexer before it to share"
        )
    return tuple(kind == "shared" for kind in kinds) if "shared" in kinds else ()


class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V3.2 (and V3.2-Exp, V3.2-Speciale): V3 with DeepSeek Sparse Attention, its
    dense and sparse layers listed by `mlp_layer_types` where the config lists them."""

    INDEXER_INTERLEAVED = False  # the indexer turns halves, the attention interleaved pairs

    @staticmethod
    def router(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
        return listed_sparse_layers(raw, config, grouped_sigmoid_moe(raw, config))

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = super().adapt_config(raw, config)
        assert config.mla is not None
        indexer = indexer_config(
            raw, config.mla, interleaved=cls.INDEXER_INTERLEAVED, layers=config.num_layers
        )
        return replace(config, mla=replace(config.mla, indexer=indexer))


class GlmMoeDsaForCausalLM(DeepseekV32ForCausalLM):
    """GLM-5: V3.2's layers, its indexer's rotary in interleaved pairs, some layers reusing the
    choice of the layer before (`indexer_types`)."""

    INDEXER_INTERLEAVED = True


class Kimi_K25ForConditionalGeneration(TextOnly, DeepseekV3ForCausalLM):  # noqa: N801
    """Moonshot's Kimi K2.5 and K2.6: a vision tower and projector before Kimi K2's language
    model (DeepSeek-V3's layers), served text only."""
