"""Gated DeltaNet, the linear attention of Qwen3.5's, Qwen3-Next's and OLMo-Hybrid's linear
layers.

Instead of K/V per token, each sequence keeps a fixed state in every such layer: the last
`conv_kernel - 1` inputs of a causal depthwise convolution over q, k and v, and one
[key_dim, value_dim] matrix per value head that each token decays and corrects (the delta rule)
and each query reads. The states live in per-layer pools with a slot per running sequence
(`RecurrentState`); the step's metadata says each sequence's slot (`state_slots`) and, for
prompt chunks, whether the sequence starts there or continues from its slot (chunked prefill).

The math itself is shard/layers/gated_delta.py's. Tensor parallel splits the key heads (and
with them their value heads) across ranks; out_proj is a row-parallel linear.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from shard.attention import AttentionMetadata, MixedMetadata, StepMetadata
from shard.layers.causal_conv import causal_conv1d_decode, causal_conv1d_prefill
from shard.layers.gated_delta import gated_delta_decode, gated_delta_prefill
from shard.layers.linear import ColumnParallelLinear, RowParallelLinear, head_range
from shard.layers.quant.base import Piece
from shard.models.config import LinearAttentionConfig, ModelConfig
from shard.models.names import Names
from shard.weights import Weights, WeightsError

# Our names of a linear layer's modules -> the checkpoint's (Qwen3.5's layout)
LINEAR_ATTENTION_NAMES: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("model.layers.{i}.linear_attn.in_proj_qkv",),
    "linear_z": ("model.layers.{i}.linear_attn.in_proj_z",),
    "linear_b": ("model.layers.{i}.linear_attn.in_proj_b",),
    "linear_a": ("model.layers.{i}.linear_attn.in_proj_a",),
    "linear_conv": ("model.layers.{i}.linear_attn.conv1d",),
    "linear_dt_bias": ("model.layers.{i}.linear_attn.dt_bias",),
    "linear_a_log": ("model.layers.{i}.linear_attn.A_log",),
    "linear_norm": ("model.layers.{i}.linear_attn.norm",),
    "linear_out": ("model.layers.{i}.linear_attn.out_proj",),
    # Qwen3-Next's fused projections (LinearAttentionConfig.projections "grouped")
    "linear_qkvz": ("model.layers.{i}.linear_attn.in_proj_qkvz",),
    "linear_ba": ("model.layers.{i}.linear_attn.in_proj_ba",),
}


@dataclass
class RecurrentState:
    """One linear layer's state pools, a slot per running sequence (on this rank's heads)."""

    conv: torch.Tensor  # [slots, conv channels, conv_kernel - 1], the model's dtype
    state: torch.Tensor  # [slots, value heads, key_head_dim, value_head_dim] float32

    @classmethod
    def empty(
        cls, slots: int, shape: LinearShape, dtype: torch.dtype, device: torch.device
    ) -> RecurrentState:
        # zeroed so that never-used slots hold finite values
        return cls(
            conv=torch.zeros(
                slots, shape.conv_channels, shape.conv_kernel - 1, dtype=dtype, device=device
            ),  # fmt: skip
            state=torch.zeros(
                slots,
                shape.value_heads,
                shape.key_dim,
                shape.value_dim,
                dtype=torch.float32,
                device=device,
            ),  # fmt: skip
        )

    @staticmethod
    def bytes_per_slot(shape: LinearShape, dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        conv = shape.conv_channels * (shape.conv_kernel - 1) * element
        return conv + shape.value_heads * shape.key_dim * shape.value_dim * 4


@dataclass(frozen=True)
class LinearShape:
    """A linear layer's sizes on this rank."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim


def _ranked(weights: Weights, cfg: LinearAttentionConfig) -> tuple[range, range]:
    """This rank's key heads and the value heads they serve."""
    dist = weights.dist
    if cfg.num_key_heads % dist.world_size:
        raise WeightsError(
            f"{dist.world_size} shards cannot split the {cfg.num_key_heads} linear-attention key "
            "heads (linear_num_key_heads): the shard count must divide it"
        )
    first, last = head_range(cfg.num_key_heads, dist.rank, dist.world_size, replicate=False)
    group = cfg.num_value_heads // cfg.num_key_heads
    return range(first, last), range(first * group, last * group)


def _grouped_pieces(
    names: Names, cfg: LinearAttentionConfig, keys: range
) -> tuple[list[Piece], list[Piece]]:
    """Qwen3-Next's in_proj_qkvz rows, per key head g: its q, its k, then the v and the z of its
    value heads; in_proj_ba's: the b, then the a of its value heads. Taken as this rank's
    [q | k | v | z] and [b | a], the order of Qwen3.5's separate projections."""
    dk, dv = cfg.key_head_dim, cfg.value_head_dim
    group = cfg.num_value_heads // cfg.num_key_heads
    qkvz, ba = names.one("linear_qkvz"), names.one("linear_ba")
    # offsets within a key head's rows: q, k, v, z
    size = 2 * dk + 2 * group * dv
    parts = [(0, dk), (dk, 2 * dk), (2 * dk, 2 * dk + group * dv), (2 * dk + group * dv, size)]
    pieces = [Piece(qkvz, g * size + a, g * size + b) for a, b in parts for g in keys]
    ba_pieces = [
        Piece(ba, g * 2 * group + a, g * 2 * group + a + group) for a in (0, group) for g in keys
    ]
    return pieces, ba_pieces


def _projection_pieces(
    names: Names,
    cfg: LinearAttentionConfig,
    keys: range,
    values: range,
    spans: list[tuple[int, int]],
) -> tuple[list[Piece], list[Piece]]:
    """This rank's rows of the input projections as [q | k | v | z] and [b | a], in whichever
    layout the checkpoint stores them (`LinearAttentionConfig.projections`); `spans` are this
    rank's q, k and v rows within a [q | k | v] of every head."""
    dk, dv = cfg.key_head_dim, cfg.value_head_dim
    z_rows = (values.start * dv, values.stop * dv)
    if cfg.projections == "grouped":
        return _grouped_pieces(names, cfg, keys)
    if cfg.projections == "single":  # one in_proj: [q | k | v | z | b | a] of every head
        proj = names.one("linear_in")
        z_at = cfg.conv_channels
        b_at = z_at + cfg.num_value_heads * dv
        a_at = b_at + cfg.num_value_heads
        pieces = [Piece(proj, a, b) for a, b in spans]
        pieces.append(Piece(proj, z_at + z_rows[0], z_at + z_rows[1]))
        ba = [Piece(proj, at + values.start, at + values.stop) for at in (b_at, a_at)]
        return pieces, ba
    if cfg.projections == "separate":
        q, k, v = (names.one(f"linear_{x}") for x in "qkv")
        pieces = [
            Piece(q, keys.start * dk, keys.stop * dk),
            Piece(k, keys.start * dk, keys.stop * dk),
            Piece(v, values.start * dv, values.stop * dv),
        ]
    else:
        pieces = [Piece(names.one("linear_qkv"), a, b) for a, b in spans]
    pieces.append(Piece(names.one("linear_z"), *z_rows))
    ba = [Piece(names.one(f"linear_{x}"), values.start, values.stop) for x in "ba"]
    return pieces, ba


class RecurrentMixer(nn.Module):
    """A mixer that keeps a fixed state per sequence in RecurrentState pools instead of K/V per
    token (Gated DeltaNet, Mamba 2's shard/models/mamba_mixer.py); `shape` sizes its pools.
    Both start with a causal depthwise conv over their channels (`conv_weight` [channels, K],
    `conv_bias` or None), whose last inputs the pools keep."""

    shape: LinearShape
    conv_weight: torch.Tensor
    conv_bias: torch.Tensor | None
    conv_silu = True  # SiLU after the conv (LFM2's short convolution has none)

    def _conv(
        self, x: torch.Tensor, cache: RecurrentState, meta: AttentionMetadata
    ) -> torch.Tensor:
        """silu(conv) of this part's channels [T, C], its sequences' conv states advanced."""
        slots = state_slots(meta)
        if meta.is_prefill:
            return causal_conv1d_prefill(
                x, self.conv_weight, cache.conv, slots, list(meta.host_query_lens),
                list(meta.host_fresh), self.conv_bias, self.conv_silu,
            )  # fmt: skip
        return causal_conv1d_decode(
            x, self.conv_weight, cache.conv, slots, self.conv_bias, self.conv_silu
        )


class GatedDeltaNet(RecurrentMixer):
    def __init__(
        self,
        in_proj_qkvz: ColumnParallelLinear,
        in_proj_ba: ColumnParallelLinear,
        conv_weight: torch.Tensor,
        dt_bias: torch.Tensor,
        a_log: torch.Tensor,
        norm_weight: torch.Tensor,
        out_proj: RowParallelLinear,
        shape: LinearShape,
        eps: float,
        beta_scale: float = 1.0,
        norm_in_float32: bool = False,
    ) -> None:
        super().__init__()
        self.in_proj_qkvz = in_proj_qkvz  # [q | k | v | z] of this rank's heads
        self.in_proj_ba = in_proj_ba  # [b | a]: per value head, the write strength and decay
        self.register_buffer("conv_weight", conv_weight, persistent=False)  # [channels, K]
        self.register_buffer("conv_bias", None, persistent=False)  # Qwen's convs have none
        self.register_buffer("dt_bias", dt_bias, persistent=False)
        # the decay's scale, -exp(A_log), kept in float32 as transformers computes it
        self.register_buffer("neg_a", -a_log.float().exp(), persistent=False)
        self.register_buffer("norm_weight", norm_weight, persistent=False)
        self.out_proj = out_proj
        self.shape = shape
        self.eps = eps
        self.beta_scale = beta_scale
        self.norm_in_float32 = norm_in_float32

    @classmethod
    def load(cls, weights: Weights, names: Names, config: ModelConfig) -> GatedDeltaNet:
        cfg = config.linear_attention
        assert cfg is not None
        keys, values = _ranked(weights, cfg)
        dk, dv = cfg.key_head_dim, cfg.value_head_dim
        key_size = cfg.num_key_heads * dk
        # the conv's channels (and in_proj_qkv's rows): all q heads, all k heads, all v heads
        spans = [
            (keys.start * dk, keys.stop * dk),
            (key_size + keys.start * dk, key_size + keys.stop * dk),
            (2 * key_size + values.start * dv, 2 * key_size + values.stop * dv),
        ]
        pieces, ba_pieces = _projection_pieces(names, cfg, keys, values, spans)
        qkvz = ColumnParallelLinear(*ColumnParallelLinear.load_pieces(weights, pieces, bias=False))
        ba = ColumnParallelLinear(*ColumnParallelLinear.load_pieces(weights, ba_pieces, bias=False))
        convs = names.many("linear_conv")
        if len(convs) > 1:
            # OLMo-Hybrid's q_conv1d, k_conv1d, v_conv1d: the one conv's rows, in three tensors
            # (transformers saves them cut into equal thirds whatever the q, k and v sizes, so
            # only their concatenation is the conv)
            whole = torch.cat([weights.get_tensor(f"{c}.weight") for c in convs])
            parts = [whole[a:b] for a, b in spans]
        else:
            parts = [weights.get_range(f"{convs[0]}.weight", 0, a, b) for a, b in spans]
        conv = convs[0]
        conv_weight = torch.cat(parts).flatten(1)  # [channels, 1, K] -> [channels, K]
        if conv_weight.shape[1] != cfg.conv_kernel:
            raise WeightsError(
                f"{conv}.weight has a kernel of {conv_weight.shape[1]}, the config says "
                f"{cfg.conv_kernel} (linear_conv_kernel_dim)"
            )
        if any(weights.has(f"{c}.bias") for c in convs):
            raise WeightsError(f"{conv}.bias: a biased linear-attention conv is not supported")
        shape = LinearShape(len(keys), len(values), dk, dv, cfg.conv_kernel)
        return cls(
            qkvz._record(weights, pieces),
            ba._record(weights, ba_pieces),
            conv_weight,
            weights.get_range(names.one("linear_dt_bias"), 0, values.start, values.stop),
            weights.get_range(names.one("linear_a_log"), 0, values.start, values.stop),
            weights.get_tensor(f"{names.one('linear_norm')}.weight"),
            RowParallelLinear.load(weights, names.one("linear_out"), bias=False),
            shape,
            cfg.norm_eps if cfg.norm_eps is not None else config.rms_norm_eps,
            cfg.beta_scale,
            cfg.norm_in_float32,
        )

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: RecurrentState,
        meta: StepMetadata,
    ) -> torch.Tensor:
        s = self.shape
        key_size, value_size = s.key_heads * s.key_dim, s.value_heads * s.value_dim
        mixed, z = self.in_proj_qkvz(hidden).split([s.conv_channels, value_size], dim=-1)
        b, a = self.in_proj_ba(hidden).split([s.value_heads, s.value_heads], dim=-1)
        beta = b.sigmoid()
        if self.beta_scale != 1.0:
            beta = beta * self.beta_scale
        # the per-token log decay: float32, as transformers (an fp16 exp would overflow)
        g = self.neg_a * F.softplus(a.float() + self.dt_bias)
        out = torch.empty(hidden.shape[0], s.value_heads, s.value_dim, dtype=hidden.dtype,
                          device=hidden.device)  # fmt: skip
        for part, start, stop in step_parts(meta, hidden.shape[0]):
            conv = self._conv(mixed[start:stop], cache, part)
            q, k, v = conv.split([key_size, key_size, value_size], dim=-1)
            out[start:stop] = self._delta(
                q.unflatten(-1, (s.key_heads, s.key_dim)),
                k.unflatten(-1, (s.key_heads, s.key_dim)),
                v.unflatten(-1, (s.value_heads, s.value_dim)),
                g[start:stop],
                beta[start:stop],
                cache,
                part,
            )
        normed = gated_rms_norm(out, z.unflatten(-1, (s.value_heads, s.value_dim)),
                                self.norm_weight, self.eps, self.norm_in_float32)  # fmt: skip
        return self.out_proj(normed.flatten(1))

    def _delta(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        cache: RecurrentState,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        slots = state_slots(meta)
        if meta.is_prefill:
            return gated_delta_prefill(
                q, k, v, g, beta, cache.state, slots, list(meta.host_query_lens),
                list(meta.host_fresh),
            )  # fmt: skip
        return gated_delta_decode(q, k, v, g, beta, cache.state, slots)


def gated_rms_norm(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    in_float32: bool = False,
    activation: Callable[[torch.Tensor], torch.Tensor] = F.silu,
) -> torch.Tensor:
    """RMSNorm over each head's values, times silu(gate) (or `activation`: Kimi Delta
    Attention's sigmoid): transformers' order of dtypes (the normed values back in the model's
    dtype before the weight, or with `in_float32` scaled in float32; the gate in float32)."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight.float() * h if in_float32 else weight * h.to(dtype)
    return (h * activation(gate.float())).to(dtype)


def step_parts(meta: StepMetadata, tokens: int) -> list[tuple[AttentionMetadata, int, int]]:
    """The step's parts with their packed token ranges: prompt chunks first, then decode rows."""
    if isinstance(meta, MixedMetadata):
        n = meta.num_prefill_tokens
        parts = []
        if meta.prefill is not None:
            parts.append((meta.prefill, 0, n))
        if meta.decode is not None:
            parts.append((meta.decode, n, tokens))
        return parts
    return [(meta, 0, tokens)]


def state_slots(meta: AttentionMetadata) -> torch.Tensor:
    if meta.state_slots is None:
        raise ValueError("a recurrent layer ran without its sequences' state slots")
    return meta.state_slots
