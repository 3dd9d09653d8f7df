"""Mistral 4 (Mistral4ForCausalLM): DeepSeek-V3's layers (multi-head latent attention, the first
`first_k_dense_replace` MLPs dense, `n_shared_experts` shared experts ungated) with a softmax
router that keeps the `topk_group` of `n_group` expert groups whose two best probabilities sum
highest, renormalised with norm_topk_prob and times routed_scaling_factor; every query scaled by
position past the rope's original length (`llama_4_scaling_beta`, as Ministral 3)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig, MoeConfig, UnsupportedArchitectureError
from shard.models.deepseek import DeepseekV3ForCausalLM
from shard.models.glm4_moe import deepseek_moe
from shard.models.llama import llama4_query_scale


def mistral4_moe(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
    return deepseek_moe(raw, config, group_score="top2")


class Mistral4ForCausalLM(DeepseekV3ForCausalLM):
    @staticmethod
    def router(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
        return mistral4_moe(raw, config)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = super().adapt_config(rotary_as_deepseek(raw), config)
        return replace(config, query_position_scale=llama4_query_scale(raw))


def rotary_as_deepseek(raw: dict[str, Any]) -> dict[str, Any]:
    """Mistral 4 states head_dim as the whole query head (nope + rope) and the rotary's share of
    it as partial_rotary_factor, where DeepSeek states head_dim = qk_rope_head_dim; the rotary
    tables are the same (YaRN's over head_dim * factor = qk_rope_head_dim dims): the config as
    DeepSeek states it."""
    rope_dim, nope = raw.get("qk_rope_head_dim"), raw.get("qk_nope_head_dim")
    head_dim = raw.get("head_dim")
    if not rope_dim or not nope or head_dim in (None, rope_dim):
        return raw
    params = dict(raw.get("rope_parameters") or {})
    factor = params.get("partial_rotary_factor", 1.0)
    if head_dim != nope + rope_dim or int(head_dim * factor) != rope_dim:
        raise UnsupportedArchitectureError(
            f"head_dim = {head_dim} with partial_rotary_factor = {factor}: the rotary must "
            f"cover the qk_rope_head_dim = {rope_dim} dims of a {nope + rope_dim}-wide head"
        )
    params["partial_rotary_factor"] = 1.0
    return {**raw, "head_dim": rope_dim, "rope_parameters": params}
