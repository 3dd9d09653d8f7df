"""Ling and Ring hybrids (inclusionAI's Ling-3.0-Flash and kin, `BailingHybridForCausalLM`):
Kimi Delta Attention (shard/models/kda_mixer.py) in five layers of six, DeepSeek-V3's
multi-head latent attention in the sixth (rotary over interleaved pairs, and a sigmoid gate a
head on its output: shard/models/gated_latent_attention.py), and DeepSeek-V3's
Mixture-of-Experts MLPs after the first `first_k_dense_replace` dense layers.

KDA here projects its forget and output gates at full rank (f_proj, g_proj) and bounds the
forget gate (`kda_safe_gate`: g = kda_lower_bound sigmoid(exp(A_log) (f + dt_bias))), rounding
it to the model's dtype and keeping its convs in float32, as transformers does. The checkpoints
name the attention module `attention` (its output projection `dense`), the embedding
`word_embeddings`, the router's correction `expert_bias`; multi-token-prediction layers after
the last are skipped.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.glm4_moe import GLM4_MOE_NAMES
from shard.models.kda_mixer import kda_names
from shard.models.kimi_linear import KimiLinearForCausalLM, kda_config
from shard.weights import Weights

_ATTN = "model.layers.{i}.attention."
BAILING_HYBRID_NAMES = {
    **GLM4_MOE_NAMES,
    "embed_tokens": ("model.word_embeddings",),
    "q_proj": (_ATTN + "q_proj",),
    "q_a_proj": (_ATTN + "q_a_proj",),
    "q_a_layernorm": (_ATTN + "q_a_layernorm",),
    "q_b_proj": (_ATTN + "q_b_proj",),
    "kv_a_proj": (_ATTN + "kv_a_proj_with_mqa",),
    "kv_a_layernorm": (_ATTN + "kv_a_layernorm",),
    "kv_b_proj": (_ATTN + "kv_b_proj",),
    "o_proj": (_ATTN + "dense",),
    "attn_output_gate": (_ATTN + "g_proj",),
    "router_correction_bias": ("model.layers.{i}.mlp.gate.expert_bias",),
    **kda_names(_ATTN, low_rank=False, out="dense"),
}


class BailingHybridForCausalLM(KimiLinearForCausalLM):
    NAMES = BAILING_HYBRID_NAMES
    SKIPS_MTP_LAYERS = True

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        # head_dim is KDA's head size here; the latent attention's rotary is qk_rope_head_dim
        # (DeepSeek-V3's mapping, past Kimi Linear's NoPE)
        rope_dims = {**raw, "head_dim": raw.get("qk_rope_head_dim")}
        config = super(KimiLinearForCausalLM, cls).adapt_config(rope_dims, config)
        if raw.get("kda_safe_gate", True):
            gate = dict(gate="bounded", gate_lower_bound=float(raw.get("kda_lower_bound", -5.0)))
        else:
            gate = dict(gate="softplus")
        kda = kda_config(
            raw, config.num_layers, decay_in_model_dtype=True, float32_conv=True, **gate
        )
        if kda.gate == "bounded" and kda.gate_lower_bound >= 0:
            raise UnsupportedArchitectureError(
                f"kda_lower_bound = {kda.gate_lower_bound} must be negative: a log decay"
            )
        return replace(config, kda=kda, attention_output_gate=True, attention_head_gate=True)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        return cls.NAMES
