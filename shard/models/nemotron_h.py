"""NVIDIA Nemotron-H (NemotronHForCausalLM: Nemotron-H 4B-56B, Nemotron Nano 2 9B/12B). Each
layer is one block, a norm and one module whose output joins the stream: a Mamba 2 mixer
(shard/models/mamba_mixer.py), softmax attention without position encoding, or an ungated
ReLU^2 MLP, in the order `layer_types` gives (the released configs' hybrid_override_pattern, which
transformers reads into it). Norms compute and scale in float32 (Fp32RMSNorm). The Hub's files
name the model `backbone.`, transformers' own module names `model.`; both are read.

Nemotron 3's Mixture-of-Experts blocks ("moe": ungated experts under a grouped sigmoid router)
are refused: the fused experts are gated.
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
from shard.models.config import MambaConfig, ModelConfig, UnsupportedArchitectureError
from shard.models.mamba_mixer import (
    ATTENTION_LAYER,
    MAMBA_LAYER,
    Mamba2Mixer,
    checked,
    layer_kinds,
)
from shard.models.mlp import UngatedMLP
from shard.models.names import Names
from shard.weights import Weights

MLP_LAYER = "mlp"
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
}
# as transformers saves it with its own module names
_SAVED_NAMES = {
    ours: tuple(name.replace("backbone.", "model.") for name in names)
    for ours, names in NEMOTRON_H_NAMES.items()
}


class BlockLayer(nn.Module):
    """norm -> one module -> added to the stream. `self_attn` is the mixer (None in an MLP
    block), as DecoderModel's layers name it."""

    def __init__(
        self, norm: RMSNorm, self_attn: Mixer | None, mlp: UngatedMLP | None = None
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
        kinds = layer_kinds(listed, config.num_layers, (ATTENTION_LAYER, MLP_LAYER, "moe"))
        if "moe" in kinds:
            raise UnsupportedArchitectureError(
                "NemotronH's Mixture-of-Experts blocks (layer_types 'moe', pattern 'E': ungated "
                "ReLU^2 experts) are not supported"
            )
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
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if weights.has(f"{_SAVED_NAMES['embed_tokens'][0]}.weight"):
            return _SAVED_NAMES
        return cls.NAMES

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
        return BlockLayer(norm, Attention.load(weights, names, config, rotary, backend))
