"""Pure Mamba 1 language models: `MambaForCausalLM` (state-spaces' mamba-130m-hf to -2.8b-hf)
and `FalconMambaForCausalLM` (TII's Falcon Mamba 7B: the same layers, with weightless RMS norms
on each mixer's time step, B and C). Every layer is a norm, then a Mamba 1 mixer
(shard/models/mamba1_mixer.py) whose output joins the stream: pure Mamba 2's blocks
(shard/models/mamba2.py) under the same `backbone.` names with the other mixer, the stream
between them in float32 (`residual_in_fp32`) as transformers' MambaBlock keeps it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import nn

from shard.attention import AttentionBackend
from shard.layers.norm import RMSNorm
from shard.layers.rotary import NoRotary, RotaryEmbedding
from shard.models.blocks import load_norm
from shard.models.config import ModelConfig
from shard.models.mamba1_mixer import (
    NO_NORM,
    WEIGHTLESS_NORM,
    Mamba1Mixer,
    mamba1_config,
    mamba1_names,
)
from shard.models.mamba2 import Mamba2ForCausalLM
from shard.models.names import Names
from shard.models.nemotron_h import BlockLayer
from shard.weights import Weights

MAMBA_NAMES: dict[str, tuple[str, ...]] = {
    "embed_tokens": ("backbone.embeddings",),
    "norm": ("backbone.norm_f",),
    "lm_head": ("lm_head",),
    "block_norm": ("backbone.layers.{i}.norm",),
    **mamba1_names("backbone.layers.{i}.mixer"),
}
# the original conversions' name of the embedding (transformers' MambaModel renames it on load)
_OLD_EMBEDDING = "backbone.embedding"


class MambaForCausalLM(Mamba2ForCausalLM):
    NAMES = MAMBA_NAMES
    # the norms on the mixers' time step, B and C (FalconMamba's)
    BCDT_NORM = NO_NORM

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **kwargs: Any) -> ModelConfig:
        # (no heads: pure Mamba 2's Llama-shaped placeholders read a head_dim)
        return super().config_from_dict({**raw, "head_dim": int(raw["hidden_size"])}, **kwargs)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        hidden = config.hidden_size
        mamba1 = mamba1_config(
            (True,) * config.num_layers,
            # transformers derives it whatever the config says
            intermediate_size=int(raw.get("expand", 2) * hidden),
            state_size=raw.get("state_size", 16),
            dt_rank=raw.get("time_step_rank", "auto"),
            hidden_size=hidden,
            conv_kernel=raw.get("conv_kernel") or 4,
            conv_bias=raw.get("use_conv_bias", True),
            proj_bias=raw.get("use_bias", False),
            conv_act=raw.get("hidden_act", "silu"),
            bcdt_norm=cls.BCDT_NORM,
            norm_eps=raw.get("mixer_rms_eps", 1e-6),
        )
        return replace(
            config,
            norm="rms",
            rms_norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
            mamba1=mamba1,
            rotary_layers=(False,) * config.num_layers,
            mlp_layers=(False,) * config.num_layers,
            moe=None,
            residual_in_float32=bool(raw.get("residual_in_fp32", True)),
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if weights.has(f"{_OLD_EMBEDDING}.weight"):
            return {**cls.NAMES, "embed_tokens": (_OLD_EMBEDDING,)}
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
        return BlockLayer(norm, Mamba1Mixer.load(weights, names, config))


class FalconMambaForCausalLM(MambaForCausalLM):
    BCDT_NORM = WEIGHTLESS_NORM
