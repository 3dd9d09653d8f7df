"""Gemma 3n (text): Gemma 4's attention (q/k norms, values normed without a weight, no query
scale, sliding and full layers with their own rope bases, the last `num_kv_shared_layers`
layers reading an earlier layer's keys and values), its per-layer embeddings and x * w norms,
and three things of its own:

- AltUp: the model carries `altup_num_inputs` streams (the embedding, and projections of it
  rescaled to its magnitude). A layer predicts every stream from all of them (coefficients
  routed from the active stream: tanh of a projection of its norm), computes attention and
  the MLP on the active prediction, and corrects every stream by the difference between that
  output and the prediction (coefficients routed from the output); the per-layer input then
  joins streams 1.. (all but the active one, the first in the releases). At the end the
  streams are projected back, rescaled to the active one's magnitude and averaged.
- Laurel: a low-rank (laurel_rank) residual beside attention, normed, the two summed over
  sqrt(2).
- Activation sparsity: in the layers `activation_sparsity_pattern` names (the first ten of the
  releases, 0.95), the MLP's gate keeps only what exceeds mean + std * icdf(sparsity) of its
  own row, shifted down by it (relu(gate - cutoff)) before the activation.

Everything as transformers' Gemma3nText* modules compute it, in their order of roundings. The
releases are Gemma3nForConditionalGeneration (E2B, E4B: vision and audio towers), served text
only; Gemma3nForCausalLM is the language model alone. Tensor parallel: attention, the MLP and
the per-layer inputs split as Gemma 4's; AltUp, Laurel and the stream projections are small
and computed whole on every rank (the MLP's row statistics are summed over the ranks).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from shard.attention import AttentionBackend, StepMetadata
from shard.distributed import Distributed
from shard.layers.activation import GATED_ACTIVATIONS
from shard.layers.linear import ColumnParallelLinear
from shard.layers.norm import RMSNorm
from shard.layers.quant.base import Piece
from shard.layers.rotary import NoRotary, RotaryEmbedding
from shard.models.blocks import Attention, DecoderModel, load_norm
from shard.models.config import AltUpConfig, ModelConfig, UnsupportedArchitectureError
from shard.models.gemma4 import (
    GEMMA4_NAMES,
    PerLayerEmbeddings,
    PerLayerInput,
    gemma4_config,
    skip_shared_kv_modules,
)
from shard.models.mlp import GatedMLP
from shard.models.names import Names
from shard.models.text_only import TextOnly
from shard.weights import Weights

GEMMA3N_NAMES: dict[str, tuple[str, ...]] = {
    **GEMMA4_NAMES,
    "laurel_left": ("model.layers.{i}.laurel.linear_left",),
    "laurel_right": ("model.layers.{i}.laurel.linear_right",),
    "laurel_norm": ("model.layers.{i}.laurel.post_laurel_norm",),
    "altup_correct_output_scale": ("model.layers.{i}.altup.correct_output_scale",),
    "altup_correction_coefs": ("model.layers.{i}.altup.correction_coefs",),
    "altup_prediction_coefs": ("model.layers.{i}.altup.prediction_coefs",),
    "altup_modality_router": ("model.layers.{i}.altup.modality_router",),
    "altup_router_norm": ("model.layers.{i}.altup.router_norm",),
    # the model's stream projections, {{j}} for the stream (1 ..)
    "altup_projection": ("model.altup_projections.{{j}}",),
    "altup_unembed_projection": ("model.altup_unembed_projections.{{j}}",),
}


def gemma3n_config(raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
    sizes = raw.get("intermediate_size")
    widest = max(sizes) if isinstance(sizes, list) else int(sizes or 0)
    config = gemma4_config(raw, replace(config, intermediate_size=widest))
    streams = int(raw.get("altup_num_inputs", 4))
    active = int(raw.get("altup_active_idx", 0))
    if streams < 1 or not 0 <= active < streams:
        raise UnsupportedArchitectureError(
            f"altup_active_idx = {active} must name one of the altup_num_inputs = {streams} streams"
        )
    sparsity = raw.get("activation_sparsity_pattern") or [0.0] * config.num_layers
    if len(sparsity) != config.num_layers or not all(0.0 <= s < 1.0 for s in sparsity):
        raise UnsupportedArchitectureError(
            f"activation_sparsity_pattern = {sparsity} must give each of the {config.num_layers} "
            "layers a value in [0, 1)"
        )
    if config.per_layer_inputs is None:
        raise UnsupportedArchitectureError("hidden_size_per_layer_input must be positive")
    altup = AltUpConfig(
        num_inputs=streams,
        active=active,
        correct_scale=bool(raw.get("altup_correct_scale", True)),
        sparsity=tuple(float(s) for s in sparsity),
    )
    return replace(config, altup=altup)


def _whole(weights: Weights, prefix: str) -> ColumnParallelLinear:
    """A small linear every rank holds whole."""
    rows = Piece(prefix, 0, ColumnParallelLinear.out_features_of(weights, prefix))
    return ColumnParallelLinear.load_rows(weights, rows, bias=False)


def _rescaled(x: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """x scaled to the root-mean-square `magnitude` (transformers' AltUp stream rescaling)."""
    own = torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True).clamp(min=1e-5))
    return x * magnitude / own


class AltUp(nn.Module):
    """A layer's predict and correct steps over the streams [N, T, hidden]."""

    def __init__(self, weights: Weights, names: Names, config: ModelConfig) -> None:
        super().__init__()
        spec = config.altup
        assert spec is not None
        self.spec = spec

        def tensor(ours: str) -> torch.Tensor:
            return weights.get_tensor(f"{names.one(ours)}.weight")

        self.register_buffer("prediction", tensor("altup_prediction_coefs"), persistent=False)
        self.register_buffer("correction", tensor("altup_correction_coefs"), persistent=False)
        self.register_buffer("router", tensor("altup_modality_router"), persistent=False)
        self.router_norm = load_norm(weights, names.one("altup_router_norm"), config)
        self.register_buffer(
            "output_scale",
            weights.get_tensor(names.one("altup_correct_output_scale")),
            persistent=False,
        )
        self.router_scale = config.hidden_size**-1.0

    def _modalities(self, x: torch.Tensor) -> torch.Tensor:
        routed = nn.functional.linear(self.router_norm(x) * self.router_scale, self.router)
        return torch.tanh(routed.float()).type_as(x)

    def predict(self, streams: torch.Tensor) -> torch.Tensor:
        n = self.spec.num_inputs
        modalities = self._modalities(streams[self.spec.active])
        coefs = nn.functional.linear(modalities, self.prediction)
        coefs = coefs.reshape(-1, n, n).permute(0, 2, 1)  # [T, N, N]
        predictions = torch.matmul(streams.permute(1, 2, 0), coefs).permute(2, 0, 1)
        return (predictions + streams).type_as(streams)

    def correct(self, predictions: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        modalities = self._modalities(activated)
        innovation = activated - predictions[self.spec.active]
        coefs = nn.functional.linear(modalities, self.correction) + 1.0  # [T, N]
        corrected = innovation[None] * coefs.permute(1, 0).unsqueeze(-1)
        return (corrected + predictions).type_as(activated)

    def scaled(self, corrected: torch.Tensor) -> torch.Tensor:
        return (corrected.type_as(self.output_scale) * self.output_scale).type_as(corrected)


class Laurel(nn.Module):
    """x + norm(right(left(x))): the low-rank residual, whole on every rank."""

    def __init__(self, weights: Weights, names: Names, config: ModelConfig) -> None:
        super().__init__()
        self.left = _whole(weights, names.one("laurel_left"))
        self.right = _whole(weights, names.one("laurel_right"))
        self.norm = load_norm(weights, names.one("laurel_norm"), config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(self.right(self.left(x)))


class SparseGatedMLP(GatedMLP):
    """GatedMLP whose gate keeps only what exceeds mean + std * icdf(sparsity) of its row
    (over the whole intermediate width: the row's sums taken over the ranks)."""

    def __init__(self, mlp: GatedMLP, sparsity: float, dist: Distributed) -> None:
        super().__init__(mlp.gate_up_proj, mlp.down_proj, mlp.act)
        self.multiplier = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(sparsity)).item()
        self.dist = dist

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        gate = torch.relu(gate - self._cutoff(gate))
        return GATED_ACTIVATIONS[self.act](gate) * up

    def _cutoff(self, gate: torch.Tensor) -> torch.Tensor:
        multiplier = torch.tensor(self.multiplier, dtype=gate.dtype, device=gate.device)
        if self.dist.world_size == 1:
            mean = torch.mean(gate, dim=-1, keepdim=True)
            std = torch.std(gate, dim=-1, keepdim=True, unbiased=False)
            return mean + std * multiplier
        # this rank's columns: sums and sums of squares over all of them, in float32
        wide = gate.float()
        sums = torch.stack((wide.sum(-1), wide.pow(2).sum(-1)), -1)
        sums = self.dist.all_reduce(sums)
        width = gate.shape[-1] * self.dist.world_size
        mean = sums[:, :1] / width
        std = (sums[:, 1:] / width - mean**2).clamp(min=0).sqrt()
        return mean.to(gate.dtype) + std.to(gate.dtype) * multiplier


class Gemma3nDecoderLayer(nn.Module):
    def __init__(
        self,
        norms: dict[str, RMSNorm],
        self_attn: Attention,
        mlp: GatedMLP,
        altup: AltUp,
        laurel: Laurel,
        per_layer_input: PerLayerInput,
    ) -> None:
        super().__init__()
        self.norms = nn.ModuleDict(norms)
        self.self_attn = self_attn
        self.mlp = mlp
        self.altup = altup
        self.laurel = laurel
        self.per_layer_input = per_layer_input

    @classmethod
    def load(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> Gemma3nDecoderLayer:
        kinds = (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        )
        norms = {kind: load_norm(weights, names.one(kind), config) for kind in kinds}
        assert config.altup is not None
        mlp = GatedMLP.load(weights, names, config)
        sparsity = config.altup.sparsity[names.layer]
        if sparsity > 0.0:
            mlp = SparseGatedMLP(mlp, sparsity, weights.dist)
        return cls(
            norms,
            Attention.load(weights, names, config, rotary, backend),
            mlp,
            AltUp(weights, names, config),
            Laurel(weights, names, config),
            PerLayerInput.load(weights, names, config),
        )

    def forward(
        self,
        streams: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: StepMetadata,
        layer_input: torch.Tensor,
    ) -> torch.Tensor:
        norms, altup = self.norms, self.altup
        active = altup.spec.active
        predictions = altup.predict(streams)
        prediction = predictions[active]
        normed = norms["input_layernorm"](prediction)
        laurel = self.laurel(normed)
        attended = norms["post_attention_layernorm"](
            self.self_attn(normed, positions, kv_cache, meta)
        )
        x = (prediction + attended + laurel) / math.sqrt(2)
        x = x + norms["post_feedforward_layernorm"](self.mlp(norms["pre_feedforward_layernorm"](x)))
        corrected = altup.correct(predictions, x)
        first = corrected[active]
        if altup.spec.correct_scale:
            first = altup.scaled(first)
        update = self.per_layer_input(first, layer_input)
        # (into streams 1.., as transformers adds it, whichever stream is active)
        return torch.cat((corrected[:1], corrected[1:] + update))


class Gemma3nForCausalLM(DecoderModel):
    NAMES = GEMMA3N_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return gemma3n_config(raw, config)

    @classmethod
    def load_layer(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> nn.Module:
        return Gemma3nDecoderLayer.load(weights, names, config, rotary, backend)

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        table = self.names_for(weights)
        skip_shared_kv_modules(weights, table, config)
        super().__init__(config, weights, attention)
        model = Names(table)
        assert config.altup is not None and config.per_layer_inputs is not None
        self.altup = config.altup
        self.per_layer_vocab = config.per_layer_inputs.vocab_size
        self.per_layer_embeddings = PerLayerEmbeddings.load(weights, model, config)

        def projections(ours: str) -> nn.ModuleList:
            (template,) = model.many(ours)
            return nn.ModuleList(
                _whole(weights, template.format(j=j)) for j in range(config.altup.num_inputs - 1)
            )

        self.altup_projections = projections("altup_projection")
        self.altup_unembed_projections = projections("altup_unembed_projection")

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: StepMetadata,
    ) -> torch.Tensor:
        embedded = self.embed_tokens(input_ids)
        # tokens past the per-layer table (the towers' special tokens) read its row 0
        in_table = (input_ids >= 0) & (input_ids < self.per_layer_vocab)
        inputs = self.per_layer_embeddings(torch.where(in_table, input_ids, 0), embedded)
        magnitude = torch.mean(embedded**2, dim=-1, keepdim=True) ** 0.5
        streams = [embedded] + [_rescaled(p(embedded), magnitude) for p in self.altup_projections]
        stream = torch.stack(streams)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            stream = layer(stream, positions, kv_cache, meta, inputs[:, i])
        magnitude = torch.mean(stream[0] ** 2, dim=-1, keepdim=True) ** 0.5
        outs = [stream[0]] + [
            _rescaled(p(stream[j + 1]), magnitude)
            for j, p in enumerate(self.altup_unembed_projections)
        ]
        return self.norm(torch.mean(torch.stack(outs), dim=0))


class Gemma3nForConditionalGeneration(TextOnly, Gemma3nForCausalLM):
    """Gemma 3n as released (vision and audio towers), served as its language model
    (shard/models/text_only.py)."""
