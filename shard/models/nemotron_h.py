"""NVIDIA Nemotron-H (NemotronHForCausalLM: Nemotron-H 4B-56B, Nemotron Nano 2 9B/12B, Nemotron 3
Nano and Super). Each layer is one block, a norm and one module whose output joins the stream: a
Mamba 2 mixer (shard/models/mamba_mixer.py), softmax attention without position encoding, an
ungated ReLU^2 MLP, or (Nemotron 3) a Mixture-of-Experts block of ungated ReLU^2 experts under
DeepSeek-V3's grouped sigmoid router with a correction bias, beside an ungated shared expert,
the experts in a latent space where the config gives one (shard/models/moe_block.py); in the
order `layer_types` gives (the released configs' hybrid_override_pattern, which transformers
reads into it). Norms compute and scale in float32 (Fp32RMSNorm). The Hub's files name the model
`backbone.` with a tensor per expert, transformers' own module names `model.` with the experts
stacked; both are read. Multi-token-prediction layers (`mtp.`) are skipped, as transformers
skips them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from shard.attention import AttentionBackend, StepMetadata
from shard.layers.activation import mlp_activation
from shard.layers.norm import RMSNorm
from shard.layers.rotary import NoRotary, RotaryEmbedding
from shard.models.blocks import Attention, DecoderModel, Mixer, load_norm
from shard.models.config import MambaConfig, ModelConfig, MoeConfig, UnsupportedArchitectureError
from shard.models.mamba_mixer import (
    ATTENTION_LAYER,
    MAMBA_LAYER,
    Mamba2Mixer,
    checked,
    layer_kinds,
)
from shard.models.mlp import UngatedMLP
from shard.models.moe_block import SparseMoeBlock
from shard.models.names import Names, in_some_layer
from shard.weights import Weights

MLP_LAYER = "mlp"
MOE_LAYER = "moe"
_LAYER = "backbone.layers.{i}"
_MIXER = f"{_LAYER}.mixer"
NEMOTRON_H_NAMES: dict[str, tuple[str, ...]] = {
    "embed_tokens": ("backbone.embeddings",),
    "norm": ("backbone.norm_f",),
    "lm_head": ("lm_head",),
    "block_norm": (f"{_LAYER}.norm",),
    "qkv_proj": (f"{_MIXER}.q_proj", f"{_MIXER}.k_proj", f"{_MIXER}.v_proj"),
    "o_proj": (f"{_MIXER}.o_proj",),
    "up_proj": (f"{_MIXER}.up_proj",),
    "down_proj": (f"{_MIXER}.down_proj",),
    "mamba_in": (f"{_MIXER}.in_proj",),
    "mamba_conv": (f"{_MIXER}.conv1d",),
    "mamba_dt_bias": (f"{_MIXER}.dt_bias",),
    "mamba_a_log": (f"{_MIXER}.A_log",),
    "mamba_d": (f"{_MIXER}.D",),
    "mamba_norm": (f"{_MIXER}.norm",),
    "mamba_out": (f"{_MIXER}.out_proj",),
    # Nemotron 3's Mixture-of-Experts blocks: "{{e}}" the expert (moe_block.py)
    "router": (f"{_MIXER}.gate",),
    "router_correction_bias": (f"{_MIXER}.gate.e_score_correction_bias",),
    "expert_gate_up": (f"{_MIXER}.experts.{{{{e}}}}.up_proj",),
    "expert_down": (f"{_MIXER}.experts.{{{{e}}}}.down_proj",),
    "shared_expert_up_proj": (f"{_MIXER}.shared_experts.up_proj",),
    "shared_expert_down_proj": (f"{_MIXER}.shared_experts.down_proj",),
    "latent_in": (f"{_MIXER}.fc1_latent_proj",),
    "latent_out": (f"{_MIXER}.fc2_latent_proj",),
}
# as transformers saves it with its own module names, and its experts stacked ([E, I, H] and
# [E, H, I]) where it holds them so
_SAVED_NAMES = {
    ours: tuple(name.replace("backbone.", "model.") for name in names)
    for ours, names in NEMOTRON_H_NAMES.items()
}
_SAVED_STACKED_EXPERTS = {
    "expert_gate_up": ("model.layers.{i}.mixer.experts.up_proj",),
    "expert_down": ("model.layers.{i}.mixer.experts.down_proj",),
}


class BlockLayer(nn.Module):
    """norm -> one module -> added to the stream. `self_attn` is the mixer (None in an MLP
    block), as DecoderModel's layers name it."""

    def __init__(
        self,
        norm: RMSNorm,
        self_attn: Mixer | None,
        mlp: UngatedMLP | SparseMoeBlock | None = None,
    ) -> None:
        super().__init__()
        self.norm = norm
        self.self_attn = self_attn
        self.mlp = mlp

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: StepMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this block's output, the stream it is still to be added to), as DecoderLayer's."""
        if residual is None:
            residual, x = hidden, self.norm(hidden)
        else:
            x, residual = self.norm(hidden, residual)
        if self.self_attn is None:
            assert self.mlp is not None
            return self.mlp(x), residual
        return self.self_attn(x, positions, kv_cache, meta), residual


class NemotronHForCausalLM(DecoderModel):
    NAMES = NEMOTRON_H_NAMES
    CONFIG_DEFAULTS = {"gated_mlp": False}

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **kwargs: Any) -> ModelConfig:
        # transformers derives num_hidden_layers from the layer list and leaves it out of the
        # dict it gives
        if "num_hidden_layers" not in raw and raw.get("layers_block_type"):
            raw = {**raw, "num_hidden_layers": len(raw["layers_block_type"])}
        return super().config_from_dict(raw, **kwargs)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        # (transformers keeps the list as layers_block_type)
        listed = raw.get("layers_block_type") or raw.get("layer_types")
        kinds = layer_kinds(listed, config.num_layers, (ATTENTION_LAYER, MLP_LAYER, MOE_LAYER))
        if raw.get("sliding_window"):
            raise UnsupportedArchitectureError("NemotronH with a sliding_window is not supported")
        mamba = MambaConfig(
            layers=tuple(kind == MAMBA_LAYER for kind in kinds),
            num_heads=raw["mamba_num_heads"],
            head_dim=raw["mamba_head_dim"],
            num_groups=raw.get("n_groups") or 1,
            state_size=raw["ssm_state_size"],
            conv_kernel=raw.get("conv_kernel") or 4,
            conv_bias=bool(raw.get("use_conv_bias", True)),
            proj_bias=bool(raw.get("use_bias", False)),
            # transformers clamps the prompt's steps at time_step_min (its one-token update
            # leaves them: a softplus output below that floor is all that can differ)
            time_step_limit=(float(raw.get("time_step_min", 0.0)), float("inf")),
        )
        return replace(
            config,
            norm="fp32_rms",
            rms_norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
            hidden_act=mlp_activation(raw.get("mlp_hidden_act", "relu2")),
            # q/k/v/o without biases whatever attention_bias says (transformers' modules)
            qkv_bias=False,
            o_bias=False,
            mamba=checked(mamba, raw.get("mamba_hidden_act", "silu")),
            rotary_layers=(False,) * config.num_layers,
            mlp_layers=tuple(kind == MLP_LAYER for kind in kinds),
            moe=_moe_config(raw, kinds) if MOE_LAYER in kinds else None,
        )

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        # Nemotron 3's multi-token-prediction layers, which transformers leaves out too
        weights.skip_modules(("mtp.", "backbone.mtp.", "model.mtp."))
        super().__init__(config, weights, attention)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if not weights.has(f"{_SAVED_NAMES['embed_tokens'][0]}.weight"):
            return cls.NAMES
        if in_some_layer(weights.has, _SAVED_STACKED_EXPERTS["expert_down"][0]):
            return _SAVED_NAMES | _SAVED_STACKED_EXPERTS
        return _SAVED_NAMES

    @classmethod
    def load_layer(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> nn.Module:
        norm = load_norm(weights, names.one("block_norm"), config)
        assert isinstance(norm, RMSNorm)
        if config.mamba_layer(names.layer):
            return BlockLayer(norm, Mamba2Mixer.load(weights, names, config))
        if config.mlp_layers[names.layer]:
            return BlockLayer(norm, None, UngatedMLP.load(weights, names, config))
        if config.sparse_mlp(names.layer):
            return BlockLayer(norm, None, SparseMoeBlock.load(weights, names, config))
        return BlockLayer(norm, Attention.load(weights, names, config, rotary, backend))


def _moe_config(raw: dict[str, Any], kinds: list[str]) -> MoeConfig:
    """Nemotron 3's Mixture-of-Experts blocks (transformers' NemotronHMoE): top-k of
    n_routed_experts by DeepSeek-V3's grouped sigmoid choice with the correction bias, the
    weights renormalised (norm_topk_prob) and scaled (routed_scaling_factor); ungated experts
    and an ungated shared expert of moe_shared_expert_intermediate_size."""
    latent = raw.get("moe_latent_size") or 0
    if latent and raw.get("mlp_bias"):
        raise UnsupportedArchitectureError(
            "NemotronH with moe_latent_size and mlp_bias: the latent projections' biases are not "
            "supported"
        )
    return MoeConfig(
        num_experts=int(raw["n_routed_experts"]),
        top_k=int(raw["num_experts_per_tok"]),
        intermediate_size=int(raw["moe_intermediate_size"]),
        renormalize=bool(raw.get("norm_topk_prob", True)),
        round_weights=False,
        sparse_layers=tuple(kind == MOE_LAYER for kind in kinds),
        # transformers builds the shared expert whatever n_shared_experts says
        shared_expert_intermediate_size=int(raw.get("moe_shared_expert_intermediate_size") or 0),
        scoring="sigmoid",
        num_groups=int(raw.get("n_group") or 1),
        top_groups=int(raw.get("topk_group") or 1),
        routed_scaling=float(raw.get("routed_scaling_factor") or 1.0),
        shared_expert_gated=False,
        float32_router=True,
        correction_bias=True,
        gated_experts=False,
        latent_size=int(latent),
    )
