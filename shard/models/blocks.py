"""The shared blocks every decoder-only architecture is composed of.

A model file names its checkpoint tensors (a `Names` table) and maps its config.json onto
`ModelConfig`; the blocks below read their options from that config and nothing else:
- `Attention`: fused q/k/v (three checkpoint tensors or one fused), optional q/k norms of the
  model's norm kind, rotary per layer (its own base and scaling, partial rotary), a sliding
  window per layer, the query scale, attention-logit soft-capping, q/k/v and o biases, q/k/v
  clamped (OLMo's clip_qkv), ALiBi's per-head linear biases (BLOOM, MPT); or
  with `ModelConfig.mla`, `LatentAttention` (shard/models/latent_attention.py: DeepSeek's
  multi-head latent attention, caching one latent vector a token; with `MlaConfig.indexer`
  `SparseLatentAttention`, shard/models/sparse_attention.py: DeepSeek Sparse Attention, each
  token attending over the earlier tokens an indexer picks; with `attention_output_gate`
  `GatedLatentAttention`, shard/models/gated_latent_attention.py: Ling's gate a head); or in
  the layers that keep a
  state per sequence instead of K/V, `GatedDeltaNet` (shard/models/linear_attention.py: Qwen3.5's
  linear attention), `KimiDeltaAttention` (shard/models/kda_mixer.py: Kimi Linear's and Ling's),
  `Mamba2Mixer` (shard/models/mamba_mixer.py: Granite 4.0-H's, Bamba's,
  NemotronH's), `Mamba1Mixer` (shard/models/mamba1_mixer.py: Jamba's) or `ShortConv`
  (shard/models/short_conv.py: LFM2's gated short convolution).
- `GatedMLP` (shard/models/mlp.py): a fused gate_up product (two tensors or one fused),
  act(gate) * up with the activation from shard/layers/activation.py's table, down projection;
  or with `gated_mlp` False `UngatedMLP`: act(up), down projection.
- `SparseMoeBlock` (shard/models/moe_block.py): the Mixture-of-Experts MLP of the layers
  `ModelConfig.moe` makes sparse (a router, the fused experts, an optional shared expert).
- `DecoderLayer`: two norms (before attention, before the MLP: Llama, Qwen, Phi-3), or with
  `sandwich_norms` four (also after each: Gemma 2 and 3), or with `parallel_block` one, whose
  output both attention and the MLP read (Cohere, Phi), or two of the same input (GPT-NeoX).
- `DecoderModel`: embedding (optionally scaled), the layers, the final norm, the LM head (tied
  or not, with a bias or not), final-logit soft-capping. Architectures subclass it with their
  names and config.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from shard.attention import AttentionBackend, StepMetadata, attend, get_attention_backend
from shard.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from shard.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    gated_query_pieces,
    head_range,
)
from shard.layers.norm import NORMS, Fp32RMSNorm, LayerNorm, ResidualAdd, RMSNorm
from shard.layers.qk_norm import HeadQKNorm, PerHeadLayerNorm, ProjectionQKNorm
from shard.layers.quant.base import Piece
from shard.layers.quant.config import QuantizationConfig
from shard.layers.rotary import (
    NoRotary,
    QueryPositionScale,
    RopeConfig,
    RotaryEmbedding,
    scaled_by_position,
)
from shard.models.base import CausalLM
from shard.models.config import ModelConfig
from shard.models.gated_latent_attention import GatedLatentAttention
from shard.models.kda_mixer import KimiDeltaAttention
from shard.models.latent_attention import LatentAttention
from shard.models.linear_attention import GatedDeltaNet, RecurrentMixer, RecurrentState
from shard.models.mamba1_mixer import Mamba1Mixer
from shard.models.mamba_mixer import Mamba2Mixer
from shard.models.mlp import GatedMLP, UngatedMLP
from shard.models.moe_block import SparseMoeBlock
from shard.models.names import LLAMA_NAMES, Names
from shard.models.short_conv import ShortConv
from shard.models.sparse_attention import SparseLatentAttention
from shard.weights import Weights, WeightsError

# How many layers past the last one may hold multi-token-prediction weights (the releases have
# num_nextn_predict_layers = 1); all of them are skipped.
_MAX_MTP_LAYERS = 8


def load_norm(weights: Weights, prefix: str, config: ModelConfig) -> RMSNorm | LayerNorm:
    if config.norm == WEIGHTLESS_RMS:  # nothing stored: a norm of the stream, hidden-wide
        return weightless_norm(config.hidden_size, weights, config)
    return NORMS[config.norm].load(weights, prefix, config.rms_norm_eps)


# config.norm of models whose RMSNorms have no weight at all (nanochat's)
WEIGHTLESS_RMS = "rms_weightless"


class Attention(nn.Module):
    def __init__(
        self,
        qkv_proj: QKVParallelLinear,
        o_proj: RowParallelLinear,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
        *,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        qk_norm: HeadQKNorm | ProjectionQKNorm | None = None,
        sinks: torch.Tensor | None = None,
        position_scale: QueryPositionScale | None = None,
        chunk: int | None = None,
        output_gate: ColumnParallelLinear | None = None,
        gate_activation: str = "sigmoid",
        norm_after_rope: bool = False,
        value_norm: RMSNorm | None = None,
        clip_qkv: float | None = None,
        value_scale: float | None = None,
        alibi: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.qkv_proj = qkv_proj
        # values times this after their projection (ModelConfig.value_scale), or None
        self.value_scale = value_scale
        # OLMo's clip_qkv: the q/k/v product clamped to [-clip, clip] before anything reads it
        self.clip_qkv = clip_qkv
        self.o_proj = o_proj
        # q and k normalised before rotary: per head (Qwen3, Gemma 3), or over the whole
        # projection (OLMo 2)
        self.qk_norm = qk_norm
        self.rotary = rotary
        self.backend = backend
        self.scale = scale
        self.window = window  # sliding-window layer: attends to the last `window` positions
        self.chunk = chunk  # chunked layer: attends within its query's chunk of `chunk`
        self.softcap = softcap
        self.position_scale = position_scale  # ModelConfig.query_position_scale
        # hidden -> this rank's heads' gates [T, H D] (ModelConfig.attention_output_gate), or None
        self.output_gate = output_gate
        self.gate_activation = gate_activation  # ModelConfig.attention_gate_activation
        self.norm_after_rope = norm_after_rope  # ModelConfig.qk_norm_after_rope
        self.value_norm = value_norm  # ModelConfig.value_norm
        # KV sharing (ModelConfig.kv_sources), wired by DecoderModel: the keys and values this
        # layer keeps for later layers, or those it reads instead of computing its own
        self.shares: SharedKV | None = None
        self.reads: SharedKV | None = None
        # this rank's heads' sink logits, float32 [heads] (gpt-oss), or None
        self.register_buffer("sinks", sinks, persistent=False)
        # this rank's heads' ALiBi slopes, float32 [heads] (BLOOM, MPT), or None
        self.register_buffer("alibi", alibi, persistent=False)

    values_are_keys = False  # the cache holds keys and values apart

    @property
    def cache_shape(self) -> tuple[int, int]:
        """(KV heads, head dims) of this layer's cache entry, on this rank."""
        return self.qkv_proj.num_kv_heads, self.qkv_proj.head_dim

    @classmethod
    def load(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> Attention:
        layer = names.layer
        head_dim, reads_other = config.head_dim_of(layer), config.kv_source(layer) is not None
        heads = config.heads_of(layer)  # (Laguna's differ by layer)
        prefixes = names.many("qkv_proj")
        if config.values_from_keys and config.values_from_keys[layer]:
            if len(prefixes) != 3:
                raise WeightsError(f"values taken from the keys need k_proj apart, not {prefixes}")
            prefixes = [prefixes[0], prefixes[1], prefixes[1]]  # v: k's rows, as they come out
        qkv = QKVParallelLinear.load_qkv(
            weights,
            prefixes,
            num_heads=heads,
            num_kv_heads=config.kv_heads_of(layer),
            head_dim=head_dim,
            bias=config.qkv_bias,
            gated_query=config.query_gate,
            queries_only=reads_other,
            by_head=config.qkv_by_head,
            value_head_dim=config.value_head_dim,
        )
        o_proj = RowParallelLinear.load(weights, names.one("o_proj"), bias=config.o_bias)
        qk_norm: HeadQKNorm | ProjectionQKNorm | None = None
        if config.projection_qk_norm:
            qk_norm = ProjectionQKNorm.load(
                weights,
                names.one("q_norm"),
                names.one("k_norm"),
                config.rms_norm_eps,
                num_heads=heads,
                num_kv_heads=config.num_kv_heads,
                head_dim=config.head_dim,
                weight_in_float32=config.norm == "fp32_rms",
            )
        elif config.per_head_qk_layernorm:
            eps = config.rms_norm_eps
            qk_norm = HeadQKNorm(
                PerHeadLayerNorm.load(weights, names.one("q_norm"), heads, eps,
                                      kv=False),
                PerHeadLayerNorm.load(weights, names.one("k_norm"), config.num_kv_heads, eps,
                                      kv=True),
            )  # fmt: skip
        elif config.qk_norm:
            qk_norm = HeadQKNorm(
                load_norm(weights, names.one("q_norm"), config),
                # a layer reading another's keys has no key norm of its own
                None if reads_other else load_norm(weights, names.one("k_norm"), config),
            )
        norm_after_rope = config.qk_norm_after_rope
        if config.qk_l2_norm and config.rotates(layer):
            key_norm = None if reads_other else weightless_norm(head_dim, weights, config)
            qk_norm = HeadQKNorm(weightless_norm(head_dim, weights, config), key_norm)
            norm_after_rope = True
        value_norm = None
        if config.value_norm and not reads_other:
            value_norm = weightless_norm(head_dim, weights, config)
        dist = weights.dist
        first, last = head_range(heads, dist.rank, dist.world_size, replicate=False)
        sinks = None
        if config.sinks_in(layer):
            name = names.one("sinks")
            sinks = weights.get_range(name, 0, first, last, stored_dtype=True).float()
        alibi = None
        if config.alibi_slopes:  # this rank's heads' slopes (ModelConfig.alibi_slopes)
            slopes = config.alibi_slopes[first:last]
            alibi = torch.tensor(slopes, dtype=torch.float32, device=weights.device)
        gate = None
        if config.attention_gate_activation not in OUTPUT_GATE_ACTIVATIONS:
            raise ValueError(
                f"attention gate {config.attention_gate_activation!r} is not one of "
                f"{sorted(OUTPUT_GATE_ACTIVATIONS)}"
            )
        if config.attention_output_gate:
            # a gate a head (LFM3's), or one for every dim of each head (AFMoE's)
            width = 1 if config.attention_head_gate else head_dim
            rows = Piece(names.one("attn_output_gate"), first * width, last * width)
            gate = ColumnParallelLinear.load_rows(weights, rows, bias=False)
        elif config.query_gate:
            gate = query_gate(weights, names.many("qkv_proj")[0], range(first, last), config)
        scale = config.attention_scale or head_dim**-0.5
        return cls(
            qkv,
            o_proj,
            rotary,
            backend,
            scale=scale,
            window=config.layer_windows[names.layer],
            softcap=config.attn_softcap,
            qk_norm=qk_norm,
            sinks=sinks,
            position_scale=config.position_scale_of(layer),
            chunk=config.chunk_of(layer),
            output_gate=gate,
            gate_activation=config.attention_gate_activation,
            norm_after_rope=norm_after_rope,
            value_norm=value_norm,
            clip_qkv=config.clip_qkv,
            value_scale=config.value_scale,
            alibi=alibi,
        )

    def clipped(self, qkv: torch.Tensor) -> torch.Tensor:
        """The q/k/v product [T, (H + 2 Hkv) D] clamped where `clip_qkv` says (clamping the
        fused product clamps q, k and v alike, as transformers clamps each)."""
        return qkv if self.clip_qkv is None else qkv.clamp(-self.clip_qkv, self.clip_qkv)

    def scale_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotated queries [T, heads, D] times their position's factor (`position_scale`)."""
        return scaled_by_position(q, positions, self.position_scale)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: StepMetadata,
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.clipped(self.qkv_proj(hidden)))
        if self.reads is not None:
            # the source layer's keys and values, rotated and normed, already in its cache
            # (this layer's cache entry is that tensor)
            k, v = self.reads.k, self.reads.v
            if self.qk_norm is not None:
                q = self.qk_norm.q_norm(q)
            q = self.rotary.rotate_queries(positions, q, meta)
        else:
            if self.value_norm is not None:
                v = self.value_norm(v)
            if self.value_scale is not None:
                v = v * self.value_scale
            v = self.padded_values(v)
            q, k = self.position(q, k, positions, meta)
            if self.shares is not None:
                self.shares.k, self.shares.v = k, v
        q = self.scale_queries(q, positions)
        out = attend(
            self.backend, q, k, v, kv_cache, meta, self.scale, self.window, self.softcap,
            self.sinks, store=self.reads is None, chunk=self.chunk, alibi=self.alibi,
        )  # fmt: skip
        out = out[..., : self.qkv_proj.value_head_dim]  # (the padding's outputs are zeros)
        return self.o_proj(self.gated(out.flatten(1), hidden))

    def padded_values(self, v: torch.Tensor) -> torch.Tensor:
        """Values [T, Hkv, Dv] zero-padded to the head dim the cache and kernels share: their
        weighted sums then carry zeros there, which the output drops."""
        missing = self.qkv_proj.head_dim - v.shape[-1]
        return F.pad(v, (0, missing)) if missing else v

    def position(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, meta: StepMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k [T, heads, D] normed (with q/k norms) and rotated: the norms first, or with
        `norm_after_rope` (Hunyuan) last."""
        if self.qk_norm is not None and not self.norm_after_rope:
            q, k = self.qk_norm(q, k)
        q, k = self.rotary(positions, q, k, meta)
        if self.qk_norm is not None and self.norm_after_rope:
            q, k = self.qk_norm(q, k)
        return q, k

    def gated(self, out: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Attention's output [T, H D] times its gate of `hidden` (output_gated), as
        transformers computes it; as it is without a gate."""
        if self.output_gate is None:
            return out
        return output_gated(out, self.output_gate(hidden), self.gate_activation)


def _softplus_in_float32(gate: torch.Tensor) -> torch.Tensor:
    return F.softplus(gate.float()).to(gate.dtype)


# ModelConfig.attention_gate_activation -> the gate's function, as transformers computes it
OUTPUT_GATE_ACTIVATIONS = {"sigmoid": torch.sigmoid, "softplus": _softplus_in_float32}


def output_gated(
    out: torch.Tensor, gate: torch.Tensor, activation: str = "sigmoid"
) -> torch.Tensor:
    """Attention's output [T, H D] times activation(gate) (OUTPUT_GATE_ACTIVATIONS): a gate for
    every dim of each head [T, H D] (AFMoE's, Laguna's per-element), or one a head [T, H] (LFM3's,
    Laguna's per-head), each head's dims times it."""
    gate = OUTPUT_GATE_ACTIVATIONS[activation](gate)
    if gate.shape[-1] == out.shape[-1]:
        return out * gate
    heads = gate.shape[-1]
    return (out.view(out.shape[0], heads, -1) * gate.unsqueeze(-1)).view(out.shape)


def weightless_norm(dim: int, weights: Weights, config: ModelConfig) -> Fp32RMSNorm:
    """A per-head norm without a weight, in float32 (Gemma 4's value norm, Llama 4's q/k L2
    norm): its weight ones."""
    return Fp32RMSNorm(torch.ones(dim, device=weights.device), config.rms_norm_eps)


class SharedKV:
    """The keys and values one layer computed in the step being run, kept for the later layers
    that attend over them (ModelConfig.kv_sources). Plain attributes, not buffers: they hold
    the step's tensors only while it runs (a captured graph's, in its pool)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None


def query_gate(
    weights: Weights, q_proj: str, heads: range, config: ModelConfig
) -> ColumnParallelLinear:
    """The output gate of `heads` where q_proj's rows hold each head's query and then its gate
    (ModelConfig.query_gate; QKVParallelLinear.load_qkv takes the queries)."""
    pieces = gated_query_pieces(q_proj, heads, config.head_dim, gate=True)
    weight = ColumnParallelLinear.load_pieces(weights, pieces, bias=config.qkv_bias)
    return ColumnParallelLinear(*weight)._record(weights, pieces)


# What mixes a layer's tokens: softmax attention, latent attention, linear attention, or a Mamba 2
# state-space mixer
Mixer = Attention | LatentAttention | GatedDeltaNet | KimiDeltaAttention | Mamba2Mixer | ShortConv


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP, each added to the residual stream; with `sandwich_norms`
    their outputs are normed too before the add (Gemma 2/3's post_attention_layernorm and
    post_feedforward_layernorm; its pre_feedforward_layernorm is the MLP's input norm). A
    `parallel` layer (Cohere, Phi) has no norm before the MLP: attention and the MLP both read
    the input norm's output, or with `parallel_mlp_norm` the MLP a norm of the layer's input of
    its own (GPT-NeoX)."""

    def __init__(
        self,
        input_layernorm: RMSNorm | LayerNorm,
        self_attn: Mixer,
        pre_mlp_layernorm: RMSNorm | LayerNorm | None,
        mlp: GatedMLP | UngatedMLP | SparseMoeBlock,
        post_attention_norm: RMSNorm | None = None,
        post_mlp_norm: RMSNorm | None = None,
        residual_scale: float | None = None,
        parallel_mlp_norm: RMSNorm | LayerNorm | None = None,
        parallel_outputs_summed: bool = False,
    ) -> None:
        super().__init__()
        self.input_layernorm = input_layernorm
        self.self_attn = self_attn
        self.pre_mlp_layernorm = pre_mlp_layernorm
        self.mlp = mlp
        self.post_attention_norm = post_attention_norm
        self.post_mlp_norm = post_mlp_norm
        self.residual_scale = residual_scale
        # parallel layers only (ModelConfig.parallel_mlp_norm, parallel_outputs_summed)
        self.parallel_mlp_norm = parallel_mlp_norm
        self.parallel_outputs_summed = parallel_outputs_summed

    @classmethod
    def load(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> DecoderLayer:
        def norm(ours: str) -> RMSNorm | LayerNorm:
            return load_norm(weights, names.one(ours), config)

        attention: Mixer
        if config.linear(names.layer):
            attention = GatedDeltaNet.load(weights, names, config)
        elif config.kda_layer(names.layer):
            attention = KimiDeltaAttention.load(weights, names, config)
        elif config.mamba_layer(names.layer):
            attention = Mamba2Mixer.load(weights, names, config)
        elif config.mamba1_layer(names.layer):
            attention = Mamba1Mixer.load(weights, names, config)
        elif config.short_conv_layer(names.layer):
            attention = ShortConv.load(weights, names, config)
        elif config.mla is not None:  # (a NoPE layer's NoRotary: Mistral Large 4's)
            latent = SparseLatentAttention if config.mla.indexer else LatentAttention
            if config.attention_output_gate and not config.mla.indexer:  # Ling's gate a head
                latent = GatedLatentAttention
            attention = latent.load(weights, names, config, rotary, backend)
        else:
            attention = Attention.load(weights, names, config, rotary, backend)
        mlp: GatedMLP | UngatedMLP | SparseMoeBlock
        if config.sparse_mlp(names.layer):
            mlp = SparseMoeBlock.load(weights, names, config)
        elif config.gated_mlp:
            mlp = GatedMLP.load(weights, names, config)
        else:
            mlp = UngatedMLP.load(weights, names, config)
        scale = config.residual_scale
        if config.parallel_block:
            mlp_norm = norm("post_attention_layernorm") if config.parallel_mlp_norm else None
            return cls(
                norm("input_layernorm"), attention, None, mlp, parallel_mlp_norm=mlp_norm,
                parallel_outputs_summed=config.parallel_outputs_summed,
            )  # fmt: skip
        if not config.sandwich_norms:
            return cls(
                norm("input_layernorm"),
                attention,
                norm("post_attention_layernorm"),
                mlp,
                residual_scale=scale,
            )
        if not config.pre_norms:  # OLMo 2: the stream enters attention and the MLP as it is
            return cls(
                ResidualAdd(),
                attention,
                ResidualAdd(),
                mlp,
                post_attention_norm=norm("post_attention_layernorm"),
                post_mlp_norm=norm("post_feedforward_layernorm"),
                residual_scale=scale,
            )
        return cls(
            norm("input_layernorm"),
            attention,
            norm("pre_feedforward_layernorm"),
            mlp,
            post_attention_norm=norm("post_attention_layernorm"),
            post_mlp_norm=norm("post_feedforward_layernorm"),
            residual_scale=scale,
        )

    @property
    def parallel(self) -> bool:
        """Attention and the MLP read the same normed input (Cohere): no norm before the MLP."""
        return self.pre_mlp_layernorm is None

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: StepMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's last output, the residual stream it is still to be added to): each
        residual add happens in the norm after it (RMSNorm with `residual`), the last one in
        the model's final norm. `residual` is None at the first layer, whose input is the
        stream itself."""
        if residual is None:
            residual, x = hidden, self.input_layernorm(hidden)
        else:
            x, residual = self.input_layernorm(hidden, residual)
        if self.parallel:
            attended = self.self_attn(x, positions, kv_cache, meta)
            if self.parallel_mlp_norm is not None:  # GPT-NeoX: of the layer's input, the stream
                x = self.parallel_mlp_norm(residual)
            if self.parallel_outputs_summed:  # Phi: (attn + mlp) + stream, in the next norm
                return attended + self.mlp(x), residual
            # Cohere: the stream gets attention's output first, then (in the next norm) the
            # MLP's, in the order transformers adds them
            return self.mlp(x), residual + attended
        x = self.self_attn(x, positions, kv_cache, meta)
        if self.post_attention_norm is not None:
            x = self.post_attention_norm(x)
        if self.residual_scale is not None:
            x = x * self.residual_scale
        x, residual = self.pre_mlp_layernorm(x, residual)
        x = self.mlp(x)
        if self.post_mlp_norm is not None:
            x = self.post_mlp_norm(x)
        if self.residual_scale is not None:
            x = x * self.residual_scale
        return x, residual


class DecoderModel(CausalLM):
    """A decoder-only model over the shared blocks. An architecture subclasses it with its
    checkpoint `NAMES` and, where its config.json differs from Llama's, `config_from_dict`."""

    NAMES: ClassVar[dict[str, tuple[str, ...]]] = LLAMA_NAMES
    # The checkpoints hold multi-token-prediction layers after the last layer
    # (`model.layers.{num_hidden_layers}...`: DeepSeek-V3's, GLM-4.5's), which transformers
    # leaves out too: skipped.
    SKIPS_MTP_LAYERS: ClassVar[bool] = False
    # ModelConfig.from_dict's architecture defaults (qkv_bias_default, qk_norm)
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {}

    @classmethod
    def config_from_dict(
        cls,
        raw: dict[str, Any],
        *,
        architecture: str,
        eos_token_ids: list[int],
        quantization: QuantizationConfig | None,
    ) -> ModelConfig:
        """config.json (with transformers' defaults filled in) -> the blocks' options."""
        config = ModelConfig.from_dict(
            raw,
            architecture=architecture,
            eos_token_ids=eos_token_ids,
            quantization=quantization,
            **cls.CONFIG_DEFAULTS,
        )
        return cls.adapt_config(raw, config)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        """The architecture's own fields on top of the Llama-shaped ones; raises ValueError for
        a config the blocks cannot serve, naming the field."""
        return config

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        """The checkpoint names of this checkpoint: `NAMES`, unless the architecture's
        checkpoints come in several layouts (Phi-3's fused or split gate/up)."""
        return cls.NAMES

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        super().__init__()
        table = self.names_for(weights)
        names = Names(table)
        if self.SKIPS_MTP_LAYERS:
            after = range(config.num_layers, config.num_layers + _MAX_MTP_LAYERS)
            weights.skip_modules(tuple(f"model.layers.{i}." for i in after))
        backend = get_attention_backend(attention)
        # One table per distinct rope (Gemma 3's local and global layers differ), shared by
        # the layers that use it: the tables cost a row per position.
        ropes: dict[RopeConfig, RotaryEmbedding] = {}
        rotaries: list[RotaryEmbedding | NoRotary] = []
        for layer in range(config.num_layers):
            rope = config.rope_of(layer)
            if not config.rotates(layer):
                rotaries.append(NoRotary())
                continue
            rotaries.append(ropes.setdefault(rope, RotaryEmbedding(rope, weights.device)))
        self.config = config
        self.embed_tokens = VocabParallelEmbedding.load(
            weights, f"{names.one('embed_tokens')}.weight", config.vocab_size, config.embed_scale
        )
        # learned absolute positions (GPTBigCode's wpe), [max positions, H]: replicated, as
        # every rank adds every row's whole vector
        self.embed_positions: nn.Parameter | None = None
        if config.learned_positions:
            positions = weights.get_tensor(f"{names.one('embed_positions')}.weight")
            positions = positions[config.learned_position_offset :]
            self.embed_positions = nn.Parameter(positions, requires_grad=False)
        self.layers = nn.ModuleList(
            self.load_layer(weights, Names(table, i), config, rotaries[i], backend)
            for i in range(config.num_layers)
        )
        self._share_kv(config)
        self.norm = load_norm(weights, names.one("norm"), config)
        lm_head = f"{names.one('lm_head')}.weight"
        head_bias = f"{names.one('lm_head')}.bias" if config.lm_head_bias else None
        if config.tie_word_embeddings:
            if weights.has(lm_head):  # some exports save the tied copy too; it is the same data
                weights.mark_consumed(lm_head)
            self.lm_head = ParallelLMHead.tied(self.embed_tokens, weights, head_bias)
        else:
            self.lm_head = ParallelLMHead.load(weights, lm_head, config.vocab_size, head_bias)
        self.final_softcap = config.final_softcap
        self.logits_divisor = config.logits_divisor
        self.logits_scale = config.logits_scale

        self.num_layers = config.num_layers
        # The layers with a paged cache of their own: not the linear ones, which keep a state
        # per sequence instead (RecurrentState), nor those reading another layer's. Their cache
        # entries may differ in shape (Gemma 4's global layers); num_kv_heads and head_dim are
        # the first's.
        self._cache_owners = [
            i for i, m in enumerate(self.mixers)
            if m is not None and not isinstance(m, RecurrentMixer) and config.kv_source(i) is None
        ]  # fmt: skip
        owners = [self.mixers[i] for i in self._cache_owners]
        self.num_kv_heads, self.head_dim = owners[0].cache_shape if owners else (0, config.head_dim)
        self.values_are_keys = bool(owners) and owners[0].values_are_keys
        self.num_paged_layers = len(owners)
        self.vocab_size = config.vocab_size
        self.max_position_embeddings = config.max_position_embeddings
        self.eos_token_ids = list(config.eos_token_ids)
        self.dtype = weights.dtype
        self.device = weights.device

    @classmethod
    def load_layer(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> nn.Module:
        """One decoder layer (an architecture whose layers are composed otherwise, Gemma 4's,
        returns its own; it keeps the mixer as `self_attn`)."""
        return DecoderLayer.load(weights, names, config, rotary, backend)

    def _share_kv(self, config: ModelConfig) -> None:
        """Each layer that reads another's keys and values gets the other's SharedKV."""
        shared: dict[int, SharedKV] = {}
        for layer in range(config.num_layers):
            source = config.kv_source(layer)
            if source is None:
                continue
            producer, consumer = self.mixers[source], self.mixers[layer]
            if not (isinstance(producer, Attention) and isinstance(consumer, Attention)):
                raise ValueError(f"layer {layer} cannot read layer {source}'s keys and values")
            if source >= layer or config.kv_source(source) is not None:
                raise ValueError(f"layer {layer} reads layer {source}, not an earlier owner")
            producer.shares = shared.setdefault(source, SharedKV())
            consumer.reads = producer.shares

    @property
    def mixers(self) -> list[Mixer | None]:
        """Each layer's mixer; None for a layer without one (NemotronH's MLP blocks)."""
        return [layer.self_attn for layer in self.layers]

    @property
    def recurrent(self) -> bool:
        return any(isinstance(m, RecurrentMixer) for m in self.mixers)

    def allocate_kv_cache(
        self, num_blocks: int, block_size: int, state_slots: int = 0
    ) -> list[torch.Tensor]:
        """CausalLM's paged caches for the attention layers; a linear layer's entry is its
        RecurrentState pools of `state_slots` sequences and one more, a scratch slot that
        CUDA graphs' padded rows update (shard/platforms/cuda/graphs.py)."""
        caches: list[torch.Tensor] = []
        for layer, m in enumerate(self.mixers):
            source = self.config.kv_source(layer)
            if m is None:  # no mixer, no cache: an empty entry keeps the list per layer
                caches.append(torch.empty(0, dtype=self.dtype, device=self.device))
            elif isinstance(m, RecurrentMixer):
                pools = RecurrentState.empty(state_slots + 1, m.shape, self.dtype, self.device)
                caches.append(pools)  # type: ignore[arg-type]
            elif source is not None:
                caches.append(caches[source])  # the same tensor: its layer writes it
            else:
                caches.append(self.paged_cache(num_blocks, block_size, *m.cache_shape))
        return caches

    def kv_cache_bytes_per_token(self) -> int:
        planes = 1 if self.values_are_keys else 2
        element = torch.empty((), dtype=self.dtype).element_size()
        shapes = [self.mixers[i].cache_shape for i in self._cache_owners]
        return sum(planes * heads * dim * element for heads, dim in shapes)

    def state_bytes_per_slot(self) -> int:
        return sum(
            RecurrentState.bytes_per_slot(m.shape, self.dtype)
            for m in self.mixers
            if isinstance(m, RecurrentMixer)
        )

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The tokens' embeddings, plus their positions' where the model learned those (added
        in the dtype, as transformers adds wte and wpe)."""
        hidden = self.embed_tokens(input_ids)
        if self.embed_positions is not None:
            hidden = hidden + F.embedding(positions, self.embed_positions)
        return hidden

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: StepMetadata,
    ) -> torch.Tensor:
        hidden, residual = self.embed(input_ids, positions), None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(hidden, residual, positions, kv_cache, meta)
        return self.norm(hidden) if residual is None else self.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.logits_divisor is not None:
            logits = logits / self.logits_divisor
        if self.logits_scale is not None:
            logits = logits * self.logits_scale
        if self.final_softcap is None:
            return logits
        # in float32 (transformers caps in the model's dtype; float32 is the closer to exact)
        cap = self.final_softcap
        return torch.tanh(logits / cap) * cap


def sqrt_hidden(config: dict[str, Any]) -> float:
    """Gemma's embedding scale."""
    return math.sqrt(config["hidden_size"])
