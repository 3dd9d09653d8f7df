"""Kimi Linear (Moonshot's Kimi-Linear-48B-A3B, `KimiLinearForCausalLM`): Kimi Delta Attention
(shard/models/kda_mixer.py) in three layers of four, DeepSeek-V3's multi-head latent attention
without position encoding in the fourth (NoPE: the latent's "rotary" key part is never turned;
transformers' model has no rotary at all), and DeepSeek-V3's Mixture-of-Experts MLPs (sigmoid
router with a correction bias, expert groups, a shared expert) after the first dense layer.

The checkpoints keep Mixtral's expert names (`block_sparse_moe.experts.{e}.w1/w3/w2`; the dense
MLPs under `mlp` as Moonshot saves them, or `block_sparse_moe` as transformers does), the KDA
convs as q_conv1d, k_conv1d, v_conv1d, and low-rank forget and output gates (f_a_proj then
f_b_proj; g_a_proj then g_b_proj). The config names the MoE fields as Kimi's code does
(num_experts, num_expert_group, moe_renormalize...): read as DeepSeek's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from shard.attention import AttentionBackend
from shard.layers.rotary import NoRotary, RotaryEmbedding
from shard.models.blocks import DecoderLayer
from shard.models.config import KdaConfig, ModelConfig, MoeConfig, UnsupportedArchitectureError
from shard.models.deepseek import DEEPSEEK_NAMES, DeepseekV3ForCausalLM
from shard.models.glm4_moe import grouped_sigmoid_moe, listed_sparse_layers
from shard.models.kda_mixer import kda_names
from shard.models.names import Names, in_some_layer
from shard.weights import Weights

_MOE = "model.layers.{i}.block_sparse_moe."
KIMI_LINEAR_NAMES = {
    **DEEPSEEK_NAMES,
    "router": (_MOE + "gate",),
    "router_correction_bias": (_MOE + "gate.e_score_correction_bias",),
    "expert_gate_up": (_MOE + "experts.{{e}}.w1", _MOE + "experts.{{e}}.w3"),
    "expert_down": (_MOE + "experts.{{e}}.w2",),
    "shared_expert_gate_up_proj": (
        _MOE + "shared_experts.gate_proj",
        _MOE + "shared_experts.up_proj",
    ),
    "shared_expert_down_proj": (_MOE + "shared_experts.down_proj",),
    **kda_names("model.layers.{i}.self_attn.", low_rank=True, out="o_proj"),
}

# Kimi's (and Ling's) config fields -> DeepSeek's, which the MoE and MLA mapping read
_DEEPSEEK_FIELDS = {
    "num_experts": "n_routed_experts",
    "num_expert_group": "n_group",
    "num_experts_per_token": "num_experts_per_tok",
    "num_shared_experts": "n_shared_experts",
    "moe_renormalize": "norm_topk_prob",
    "model_max_length": "max_position_embeddings",
}


def deepseek_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` with Kimi's MoE field names also under DeepSeek's."""
    return {**raw, **{ds: raw[ours] for ours, ds in _DEEPSEEK_FIELDS.items() if ours in raw}}


def kda_config(raw: dict[str, Any], num_layers: int, **options: Any) -> KdaConfig:
    """The KDA layers (`layer_types` "linear_attention"; the others "full_attention") and their
    shapes (linear_num_heads heads of linear_head_dim, linear_conv_kernel_dim); raises naming the
    field it cannot serve. `options`: KdaConfig's gate fields."""
    kinds = raw.get("layer_types") or []
    if len(kinds) != num_layers or not set(kinds) <= {"linear_attention", "full_attention"}:
        raise UnsupportedArchitectureError(
            f"layer_types = {kinds} must name each of the {num_layers} layers "
            "'linear_attention' or 'full_attention'"
        )
    kda = KdaConfig(
        layers=tuple(kind == "linear_attention" for kind in kinds),
        num_heads=int(raw["linear_num_heads"]),
        head_dim=int(raw["linear_head_dim"]),
        conv_kernel=int(raw["linear_conv_kernel_dim"]),
        **options,
    )
    if min(kda.num_heads, kda.head_dim, kda.conv_kernel) < 1:
        raise UnsupportedArchitectureError(
            f"linear_num_heads = {kda.num_heads}, linear_head_dim = {kda.head_dim} and "
            f"linear_conv_kernel_dim = {kda.conv_kernel} must be positive"
        )
    return kda


class UnturnedRotary(nn.Module):
    """Kimi Linear's NoPE latent attention: the latent's rotary key part (and each query's) is
    there, computed and cached as DeepSeek's, but never turned. Not NoRotary, which means a
    latent without that part (Mistral Large 4's NoPE layers)."""

    plain = False

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, meta: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


class KimiLinearForCausalLM(DeepseekV3ForCausalLM):
    NAMES = KIMI_LINEAR_NAMES

    @staticmethod
    def router(raw: dict[str, Any], config: ModelConfig) -> MoeConfig:
        return listed_sparse_layers(raw, config, grouped_sigmoid_moe(raw, config))

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **fields: Any) -> ModelConfig:
        return super().config_from_dict(deepseek_fields(raw), **fields)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = super().adapt_config(raw, config)
        return replace(
            config,
            kda=kda_config(raw, config.num_layers),
            rotary_layers=(False,) * config.num_layers,  # NoPE latent attention
        )

    @classmethod
    def load_layer(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> nn.Module:
        if not config.rotates(names.layer):  # (every layer: rotary_layers above)
            rotary = UnturnedRotary()  # type: ignore[assignment]
        return DecoderLayer.load(weights, names, config, rotary, backend)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        # the Hub's layout (transformers' own module names are not served); Moonshot's files
        # keep the dense MLPs under `mlp`, transformers saves them under `block_sparse_moe` too
        dense = "model.layers.{i}.block_sparse_moe.gate_proj.weight"
        if not in_some_layer(weights.has, dense):
            return cls.NAMES
        return {
            **cls.NAMES,
            "gate_up_proj": (_MOE + "gate_proj", _MOE + "up_proj"),
            "down_proj": (_MOE + "down_proj",),
        }
