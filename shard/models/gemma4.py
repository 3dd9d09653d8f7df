"""Gemma 4 (text): Gemma 3's four norms a layer and sliding/global pattern, with
- global layers of wider heads and fewer KV heads (`per_layer_config`), rotated by proportional
  rope; in the larger models their values are their keys' projection (`attention_k_eq_v`);
- q/k norms, and the values normed per head without a weight; no query scale (1.0);
- plain `x * w` RMSNorms computed in float32 ("fp32_rms"), each layer's output times a stored
  `layer_scalar`;
- the small models' per-layer embeddings (PLE: `hidden_size_per_layer_input`), gated into each
  layer's stream after its MLP, and their last `num_kv_shared_layers` layers attending over
  the keys and values of the last earlier layer of their kind (ModelConfig.kv_sources), with
  MLPs twice as wide there (`use_double_wide_mlp`, read off the weights);
- the MoE model's experts beside every layer's dense MLP (`enable_moe_block`): a router over
  the un-normed stream (weightless norm, a learned scale, softmax top-k renormalised, a scale
  per expert), each half normed on its own before they are summed.

The released checkpoints are Gemma4ForConditionalGeneration (vision and audio towers), served
text only; Gemma4ForCausalLM is the language model alone.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shard.attention import AttentionBackend, StepMetadata
from shard.distributed import Distributed
from shard.layers.activation import GATED_ACTIVATIONS, gated_activation
from shard.layers.embedding import VocabParallelEmbedding
from shard.layers.linear import ColumnParallelLinear, RowParallelLinear
from shard.layers.moe import FusedMoE, route
from shard.layers.norm import Fp32RMSNorm, RMSNorm
from shard.layers.quant.base import Piece
from shard.layers.rotary import NoRotary, RopeConfig, RotaryEmbedding
from shard.models.blocks import Attention, DecoderModel, load_norm, sqrt_hidden
from shard.models.config import (
    ModelConfig,
    MoeConfig,
    PerLayerInputConfig,
    UnsupportedArchitectureError,
)
from shard.models.gemma2 import GEMMA_NAMES
from shard.models.mlp import GatedMLP
from shard.models.moe_block import replicated_linear
from shard.models.names import Names
from shard.models.text_only import TextOnly
from shard.weights import Weights, WeightsError

GEMMA4_NAMES: dict[str, tuple[str, ...]] = {
    **GEMMA_NAMES,
    "v_norm": ("model.layers.{i}.self_attn.v_norm",),
    "layer_scalar": ("model.layers.{i}.layer_scalar",),
    # per-layer embeddings
    "embed_tokens_per_layer": ("model.embed_tokens_per_layer",),
    "per_layer_model_projection": ("model.per_layer_model_projection",),
    "per_layer_projection_norm": ("model.per_layer_projection_norm",),
    "per_layer_input_gate": ("model.layers.{i}.per_layer_input_gate",),
    "per_layer_projection": ("model.layers.{i}.per_layer_projection",),
    "post_per_layer_input_norm": ("model.layers.{i}.post_per_layer_input_norm",),
    # the experts beside the dense MLP
    "router_proj": ("model.layers.{i}.router.proj",),
    "router_scale": ("model.layers.{i}.router.scale",),
    "router_expert_scale": ("model.layers.{i}.router.per_expert_scale",),
    "expert_gate_up": ("model.layers.{i}.experts.gate_up_proj",),
    "expert_down": ("model.layers.{i}.experts.down_proj",),
    "pre_feedforward_layernorm_2": ("model.layers.{i}.pre_feedforward_layernorm_2",),
    "post_feedforward_layernorm_1": ("model.layers.{i}.post_feedforward_layernorm_1",),
    "post_feedforward_layernorm_2": ("model.layers.{i}.post_feedforward_layernorm_2",),
}
_LAYER_KINDS = ("sliding_attention", "full_attention")
_PER_LAYER_FIELDS = {"head_dim", "num_key_value_heads"}


def _attention_shapes(raw: dict[str, Any], config: ModelConfig) -> tuple[tuple[int, int], ...]:
    """Per layer (KV heads, head dims): per_layer_config's overrides (the global layers')."""
    overrides = raw.get("per_layer_config") or {}
    shapes = []
    for layer in range(config.num_layers):
        entry = overrides.get(str(layer), overrides.get(layer)) or {}
        unknown = set(entry) - _PER_LAYER_FIELDS
        if unknown:
            raise UnsupportedArchitectureError(
                f"per_layer_config[{layer}] sets {sorted(unknown)}: only "
                f"{sorted(_PER_LAYER_FIELDS)} may differ by layer"
            )
        heads = int(entry.get("num_key_value_heads") or config.num_kv_heads)
        shapes.append((heads, int(entry.get("head_dim") or config.head_dim)))
    return tuple(shapes)


def _kv_sources(kinds: list[str], shared: int) -> tuple[int | None, ...]:
    """The last `shared` layers each read the last earlier layer of their kind."""
    first = len(kinds) - shared
    if shared < 0 or first < 1:
        raise UnsupportedArchitectureError(
            f"num_kv_shared_layers {shared} must leave some of the {len(kinds)} layers their own"
        )
    sources: list[int | None] = [None] * first
    for layer in range(first, len(kinds)):
        owners = [i for i in range(first) if kinds[i] == kinds[layer]]
        if not owners:
            raise UnsupportedArchitectureError(
                f"layer {layer} ({kinds[layer]}) shares keys and values, but no earlier layer of "
                "its kind computes them"
            )
        sources.append(owners[-1])
    return tuple(sources)


def gemma4_config(raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
    if raw.get("use_bidirectional_attention") == "all":
        raise UnsupportedArchitectureError(
            "use_bidirectional_attention='all' is not supported (causal LMs only)"
        )
    kinds = list(raw.get("layer_types") or [])
    if len(kinds) != config.num_layers or set(kinds) - set(_LAYER_KINDS):
        raise UnsupportedArchitectureError(f"layer_types {kinds} are not supported")
    shapes = _attention_shapes(raw, config)
    ropes = tuple(
        RopeConfig.from_config_dict(raw, head_dim, layer_type=kind)
        for kind, (_, head_dim) in zip(kinds, shapes, strict=True)
    )
    per_layer = None
    if raw.get("hidden_size_per_layer_input"):
        per_layer = PerLayerInputConfig(
            vocab_size=int(raw["vocab_size_per_layer_input"]),
            size=int(raw["hidden_size_per_layer_input"]),
        )
    moe = None
    if raw.get("enable_moe_block"):
        moe = MoeConfig(
            num_experts=int(raw["num_experts"]),
            top_k=int(raw["top_k_experts"]),
            intermediate_size=int(raw["moe_intermediate_size"]),
            renormalize=True,
            round_weights=False,
            sparse_layers=(True,) * config.num_layers,
        )
    keys_as_values = bool(raw.get("attention_k_eq_v"))
    return replace(
        config,
        hidden_act=gated_activation(raw.get("hidden_activation") or raw.get("hidden_act")),
        norm="fp32_rms",
        sandwich_norms=True,
        embed_scale=sqrt_hidden(raw),
        attention_scale=1.0,  # the q/k norms stand for the scale
        final_softcap=raw.get("final_logit_softcapping") or None,
        layer_ropes=ropes,
        rope=ropes[0],
        layer_attention_shapes=shapes,
        values_from_keys=tuple(keys_as_values and kind == "full_attention" for kind in kinds),
        value_norm=True,
        kv_sources=_kv_sources(kinds, int(raw.get("num_kv_shared_layers") or 0)),
        per_layer_inputs=per_layer,
        moe=moe,
    )


class Gemma4Experts(nn.Module):
    """The MoE model's sparse half: routed from the layer's un-normed stream, run on its own
    norm of it, normed again; this rank's experts' outputs summed over ranks first."""

    def __init__(
        self,
        router: torch.Tensor,
        router_scale: torch.Tensor,
        expert_scale: torch.Tensor,
        experts: FusedMoE,
        pre_norm: RMSNorm,
        post_norm: RMSNorm,
        *,
        top_k: int,
        eps: float,
        dist: Distributed,
    ) -> None:
        super().__init__()
        hidden = router.shape[1]
        self.router = nn.Parameter(router, requires_grad=False)
        # the router's weightless norm, then its learned scale times hidden ** -0.5
        self.router_norm = Fp32RMSNorm(torch.ones(hidden, device=router.device), eps)
        self.router_scale = nn.Parameter(router_scale, requires_grad=False)
        self.root = hidden**-0.5
        self.expert_scale = nn.Parameter(expert_scale, requires_grad=False)
        self.experts = experts
        self.pre_norm, self.post_norm = pre_norm, post_norm
        self.top_k = top_k
        self.dist = dist

    @classmethod
    def load(cls, weights: Weights, names: Names, config: ModelConfig) -> Gemma4Experts:
        moe = config.moe
        assert moe is not None
        experts = FusedMoE.load(
            weights,
            names.many("expert_gate_up"),
            names.one("expert_down"),
            num_experts=moe.num_experts,
            intermediate_size=moe.intermediate_size,
            act=config.hidden_act,
            expert_parallel=weights.expert_parallel,
        )
        router = replicated_linear(weights, names.one("router_proj"))
        if router.shape[0] != moe.num_experts:
            raise WeightsError(
                f"{names.one('router_proj')}: {router.shape[0]} rows for {moe.num_experts} experts"
            )
        return cls(
            router,
            weights.get_tensor(names.one("router_scale")),
            weights.get_tensor(names.one("router_expert_scale")),
            experts,
            load_norm(weights, names.one("pre_feedforward_layernorm_2"), config),
            load_norm(weights, names.one("post_feedforward_layernorm_2"), config),
            top_k=moe.top_k,
            eps=config.rms_norm_eps,
            dist=weights.dist,
        )

    def forward(self, stream: torch.Tensor) -> torch.Tensor:
        routed = self.router_norm(stream) * self.router_scale * self.root
        weights, ids = route(
            F.linear(routed, self.router), self.top_k, renormalize=True, round_to=None
        )
        weights = weights * self.expert_scale[ids.long()]
        out = self.experts(self.pre_norm(stream), weights, ids)
        return self.post_norm(self.dist.all_reduce(out))


class PerLayerInput(nn.Module):
    """A layer's share of the per-layer embeddings: act(gate(stream)) times the layer's input,
    projected back and normed. The gate splits its outputs over ranks (each rank takes its
    columns of the input), the projection its inputs (summed over ranks)."""

    def __init__(
        self, gate: ColumnParallelLinear, projection: RowParallelLinear, norm: RMSNorm, act: str
    ) -> None:
        super().__init__()
        self.gate, self.projection, self.norm = gate, projection, norm
        self.act = act
        (piece,) = gate.pieces
        self.columns = (piece.start, piece.stop)

    @classmethod
    def load(cls, weights: Weights, names: Names, config: ModelConfig) -> PerLayerInput:
        return cls(
            ColumnParallelLinear.load(weights, names.one("per_layer_input_gate"), bias=False),
            RowParallelLinear.load(weights, names.one("per_layer_projection"), bias=False),
            load_norm(weights, names.one("post_per_layer_input_norm"), config),
            config.hidden_act,
        )

    def forward(self, stream: torch.Tensor, layer_input: torch.Tensor) -> torch.Tensor:
        start, stop = self.columns
        gated = GATED_ACTIVATIONS[self.act](self.gate(stream)) * layer_input[:, start:stop]
        return self.norm(self.projection(gated))


class PerLayerEmbeddings(nn.Module):
    """Every layer's input for each token [T, L, P]: the token's own row of a second embedding
    (scaled by sqrt(P)) and a projection of its main embedding (scaled by hidden ** -0.5, normed
    per layer), summed and scaled by 1 / sqrt(2)."""

    def __init__(
        self,
        table: VocabParallelEmbedding,
        projection: ColumnParallelLinear,
        norm: RMSNorm,
        num_layers: int,
        hidden_size: int,
        size: int,
    ) -> None:
        super().__init__()
        self.table = table
        self.projection = projection  # whole on every rank (each needs every layer's input)
        self.projection_scale = hidden_size**-0.5
        self.norm = norm
        self.num_layers, self.size = num_layers, size

    @classmethod
    def load(cls, weights: Weights, names: Names, config: ModelConfig) -> PerLayerEmbeddings:
        spec = config.per_layer_inputs
        assert spec is not None
        table = VocabParallelEmbedding.load(
            weights,
            f"{names.one('embed_tokens_per_layer')}.weight",
            spec.vocab_size,
            math.sqrt(spec.size),
        )
        width = config.num_layers * spec.size
        if table.weight.shape[1] != width:
            raise WeightsError(
                f"{names.one('embed_tokens_per_layer')}: {table.weight.shape[1]} columns, not "
                f"{config.num_layers} layers x hidden_size_per_layer_input {spec.size}"
            )
        projection = names.one("per_layer_model_projection")
        rows = Piece(projection, 0, ColumnParallelLinear.out_features_of(weights, projection))
        return cls(
            table,
            ColumnParallelLinear.load_rows(weights, rows, bias=False),
            load_norm(weights, names.one("per_layer_projection_norm"), config),
            config.num_layers,
            config.hidden_size,
            spec.size,
        )

    def forward(self, input_ids: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        shape = (-1, self.num_layers, self.size)
        own = self.table(input_ids).view(shape)
        projected = self.projection(embedded) * self.projection_scale
        return (self.norm(projected.view(shape)) + own) * 2**-0.5


class Gemma4DecoderLayer(nn.Module):
    """Attention and the MLP (with the experts beside it) each between two norms, their
    outputs added to the stream; then the layer's per-layer input; the stream times the
    layer's scalar. Returns the whole stream (the scalar scales it, so no residual add is left
    to the next norm)."""

    def __init__(
        self,
        norms: dict[str, RMSNorm],
        self_attn: Attention,
        mlp: GatedMLP,
        layer_scalar: torch.Tensor,
        experts: Gemma4Experts | None,
        per_layer_input: PerLayerInput | None,
    ) -> None:
        super().__init__()
        self.norms = nn.ModuleDict(norms)
        self.self_attn = self_attn
        self.mlp = mlp
        self.register_buffer("layer_scalar", layer_scalar, persistent=False)
        self.sparse = experts  # (not `experts`: the FusedMoE inside it is that)
        self.per_layer_input = per_layer_input

    @classmethod
    def load(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> Gemma4DecoderLayer:
        kinds = [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ]
        if config.moe is not None:
            kinds.append("post_feedforward_layernorm_1")
        norms = {kind: load_norm(weights, names.one(kind), config) for kind in kinds}
        return cls(
            norms,
            Attention.load(weights, names, config, rotary, backend),
            GatedMLP.load(weights, names, config),
            weights.get_tensor(names.one("layer_scalar")),
            None if config.moe is None else Gemma4Experts.load(weights, names, config),
            None if config.per_layer_inputs is None else PerLayerInput.load(weights, names, config),
        )

    def forward(
        self,
        stream: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: StepMetadata,
        layer_input: torch.Tensor | None,
    ) -> torch.Tensor:
        norms = self.norms
        x = self.self_attn(norms["input_layernorm"](stream), positions, kv_cache, meta)
        x, stream = norms["pre_feedforward_layernorm"](norms["post_attention_layernorm"](x), stream)
        x = self.mlp(x)
        if self.sparse is not None:
            x = norms["post_feedforward_layernorm_1"](x) + self.sparse(stream)
        stream = stream + norms["post_feedforward_layernorm"](x)
        if self.per_layer_input is not None:
            assert layer_input is not None
            stream = stream + self.per_layer_input(stream, layer_input)
        return stream * self.layer_scalar


def skip_shared_kv_modules(
    weights: Weights, table: dict[str, tuple[str, ...]], config: ModelConfig
) -> None:
    """The KV-sharing layers' key and value modules (and their norms), which the released files
    may keep and those layers never run, deliberately not loaded (Gemma 4's, Gemma 3n's)."""
    unused = []
    for layer in range(config.num_layers):
        if config.kv_source(layer) is not None:
            names = Names(table, layer)
            unused += [*names.many("qkv_proj")[1:], names.one("k_norm"), names.one("v_norm")]
    weights.skip_modules(tuple(f"{module}." for module in unused))


class Gemma4ForCausalLM(DecoderModel):
    NAMES = GEMMA4_NAMES
    CONFIG_DEFAULTS = {"qk_norm": True}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return gemma4_config(raw, config)

    @classmethod
    def load_layer(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> nn.Module:
        return Gemma4DecoderLayer.load(weights, names, config, rotary, backend)

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        table = self.names_for(weights)
        skip_shared_kv_modules(weights, table, config)
        super().__init__(config, weights, attention)
        self.per_layer_embeddings = None
        if config.per_layer_inputs is not None:
            self.per_layer_embeddings = PerLayerEmbeddings.load(weights, Names(table), config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: StepMetadata,
    ) -> torch.Tensor:
        stream = self.embed_tokens(input_ids)
        inputs = None
        if self.per_layer_embeddings is not None:
            inputs = self.per_layer_embeddings(input_ids, stream)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            stream = layer(
                stream, positions, kv_cache, meta, None if inputs is None else inputs[:, i]
            )
        return self.norm(stream)


class Gemma4ForConditionalGeneration(TextOnly, Gemma4ForCausalLM):
    """Gemma 4 as released (vision and audio towers), served as its language model
    (shard/models/text_only.py)."""
