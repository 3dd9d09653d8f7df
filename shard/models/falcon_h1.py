"""TII's Falcon-H1 (`FalconH1ForCausalLM`: 0.5B to 34B, Falcon-H1R, Falcon-H1-Tiny): in every
layer a Mamba 2 mixer (shard/models/mamba_mixer.py) and softmax attention side by side on the
same normed input, their outputs summed into the stream, then a SwiGLU MLP; and the muP
multipliers, as transformers computes them:

- the embeddings times `embedding_multiplier`, the logits times `lm_head_multiplier`;
- the mixer's input times `ssm_in_multiplier`, its in_proj's parts (z, x, B, C, dt) times
  `ssm_multipliers` (MambaConfig.projection_scales), its output times `ssm_out_multiplier`; its
  output and gate meet as `mamba_rms_norm` and `mamba_norm_before_gate` say (a gated RMSNorm
  either way round, or the gate alone); its width `mamba_d_ssm`;
- attention's input times `attention_in_multiplier`, its output times
  `attention_out_multiplier`, its keys times `key_multiplier` (which only ever meets the
  scores: folded into the query scale, exactly the same product up to rounding);
- the MLP's gate times the first of `mlp_multipliers` before the activation, its output times
  the second.

Each layer keeps both kinds of cache: its attention's paged K/V and its mixer's state. The
model lists its mixers two a layer (`mixers`: attention, then Mamba), so that the caches are
allocated, sized and handed out per mixer; its forward gives each layer its two.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from shard.attention import AttentionBackend, StepMetadata
from shard.layers.activation import GATED_ACTIVATIONS
from shard.layers.rotary import NoRotary, RotaryEmbedding
from shard.models.blocks import Attention, DecoderModel, Mixer, load_norm
from shard.models.config import FalconH1Scales, ModelConfig, UnsupportedArchitectureError
from shard.models.linear_attention import RecurrentState
from shard.models.mamba_mixer import MAMBA_NAMES, Mamba2Mixer, mamba_config
from shard.models.mlp import GatedMLP
from shard.models.names import LLAMA_NAMES, Names
from shard.weights import Weights

FALCON_H1_NAMES = {
    **LLAMA_NAMES,
    **MAMBA_NAMES,
    "norm": ("model.final_layernorm",),
    "post_attention_layernorm": ("model.layers.{i}.pre_ff_layernorm",),
    "gate_up_proj": (
        "model.layers.{i}.feed_forward.gate_proj",
        "model.layers.{i}.feed_forward.up_proj",
    ),
    "down_proj": ("model.layers.{i}.feed_forward.down_proj",),
}


def _pair(raw: dict[str, Any], name: str, size: int) -> tuple[float, ...]:
    values = raw.get(name) or [1.0] * size
    if len(values) != size:
        raise UnsupportedArchitectureError(f"{name} = {values} must hold {size} numbers")
    return tuple(float(v) for v in values)


def falcon_h1_config(raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
    if not raw.get("mamba_rms_norm", False):
        gate_norm = "gate"
    elif raw.get("mamba_norm_before_gate", True):
        gate_norm = "norm_then_gate"
    else:
        gate_norm = "gate_then_norm"
    # every layer's mixer (its layer_types name the attention beside it, not a kind)
    mamba = replace(
        mamba_config(raw, None, config),
        projection_scales=_pair(raw, "ssm_multipliers", 5),
        gate_norm=gate_norm,
        out_bias=bool(raw.get("projectors_bias", False)),
    )
    key_multiplier = float(raw.get("key_multiplier") or 1.0)
    gate, down = _pair(raw, "mlp_multipliers", 2)
    scales = FalconH1Scales(
        ssm_in=float(raw.get("ssm_in_multiplier") or 1.0),
        ssm_out=float(raw.get("ssm_out_multiplier") or 1.0),
        attention_in=float(raw.get("attention_in_multiplier") or 1.0),
        attention_out=float(raw.get("attention_out_multiplier") or 1.0),
        mlp_gate=gate,
        mlp_down=down,
    )
    return replace(
        config,
        mamba=mamba,
        falcon_h1=scales,
        attention_scale=config.head_dim**-0.5 * key_multiplier,
        embed_scale=float(raw.get("embedding_multiplier") or 1.0),
        logits_scale=float(raw.get("lm_head_multiplier") or 1.0),
    )


class FalconH1MLP(GatedMLP):
    """SwiGLU with the gate scaled before its activation and the output after."""

    def __init__(self, mlp: GatedMLP, gate_scale: float, down_scale: float) -> None:
        super().__init__(mlp.gate_up_proj, mlp.down_proj, mlp.act)
        self.gate_scale, self.down_scale = gate_scale, down_scale

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return up * GATED_ACTIVATIONS[self.act](gate * self.gate_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.down_scale


class FalconH1DecoderLayer(nn.Module):
    def __init__(
        self,
        input_layernorm: nn.Module,
        self_attn: Attention,
        mamba: Mamba2Mixer,
        pre_ff_layernorm: nn.Module,
        mlp: FalconH1MLP,
        scales: FalconH1Scales,
    ) -> None:
        super().__init__()
        self.input_layernorm = input_layernorm
        self.self_attn = self_attn
        self.mamba = mamba
        self.pre_ff_layernorm = pre_ff_layernorm
        self.mlp = mlp
        self.scales = scales

    @classmethod
    def load(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> FalconH1DecoderLayer:
        scales = config.falcon_h1
        assert scales is not None
        return cls(
            load_norm(weights, names.one("input_layernorm"), config),
            Attention.load(weights, names, config, rotary, backend),
            Mamba2Mixer.load(weights, names, config),
            load_norm(weights, names.one("post_attention_layernorm"), config),
            FalconH1MLP(GatedMLP.load(weights, names, config), scales.mlp_gate, scales.mlp_down),
            scales,
        )

    def forward(
        self,
        stream: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        state: RecurrentState,
        meta: StepMetadata,
    ) -> torch.Tensor:
        s = self.scales
        x = self.input_layernorm(stream)
        mixed = self.mamba(x * s.ssm_in, positions, state, meta)
        attended = self.self_attn(x * s.attention_in, positions, kv_cache, meta)
        both = mixed * s.ssm_out + attended * s.attention_out
        stream = stream + both
        return stream + self.mlp(self.pre_ff_layernorm(stream))


class FalconH1ForCausalLM(DecoderModel):
    NAMES = FALCON_H1_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return falcon_h1_config(raw, config)

    @classmethod
    def load_layer(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> nn.Module:
        return FalconH1DecoderLayer.load(weights, names, config, rotary, backend)

    @property
    def mixers(self) -> list[Mixer | None]:
        """Two a layer, each with its cache: the attention's paged K/V, then the mixer's state."""
        return [m for layer in self.layers for m in (layer.self_attn, layer.mamba)]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: StepMetadata,
    ) -> torch.Tensor:
        stream = self.embed(input_ids, positions)
        for i, layer in enumerate(self.layers):
            stream = layer(stream, positions, kv_caches[2 * i], kv_caches[2 * i + 1], meta)
        return self.norm(stream)
