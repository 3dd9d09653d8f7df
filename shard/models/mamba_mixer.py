"""The Mamba 2 mixer of hybrid models' state-space layers (Granite 4.0-H: transformers'
`GraniteMoeHybridMambaLayer`; Bamba's and NemotronH's are the same module).

One input projection gives, per token, the gate z, the conv's channels (the values x of every
head, then B and C of every group) and each head's raw time step dt. The conv (SiLU after) is
shard/layers/causal_conv.py's, the scan shard/layers/ssd.py's; its output times silu(z) is
RMS-normed per group of heads and projected back by out_proj.

A sequence's state is its last conv inputs and a [state_size, head_dim] matrix per head, in
RecurrentState pools with a slot per running sequence (as Gated DeltaNet's:
shard/models/linear_attention.py, whose LinearShape sizes them with the groups as key heads).

Tensor parallel splits the heads; a rank reads the B and C of the groups its heads belong to
(every rank the same ones when there are fewer groups than ranks, as Granite's one group). The
norm's groups then span ranks, and the sums of squares are summed over the ranks first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from shard.attention import AttentionMetadata, StepMetadata
from shard.distributed import Distributed
from shard.layers.linear import ColumnParallelLinear, RowParallelLinear, head_range
from shard.layers.quant.base import Piece
from shard.layers.ssd import ssd_decode, ssd_prefill, time_steps
from shard.models.config import MambaConfig, ModelConfig, UnsupportedArchitectureError
from shard.models.linear_attention import (
    LinearShape,
    RecurrentMixer,
    RecurrentState,
    state_slots,
    step_parts,
)
from shard.models.names import Names
from shard.weights import Weights, WeightsError

# Our names of a Mamba 2 mixer's modules -> the checkpoint's (Granite 4.0-H's and Bamba's layout)
MAMBA_NAMES: dict[str, tuple[str, ...]] = {
    "mamba_in": ("model.layers.{i}.mamba.in_proj",),
    "mamba_conv": ("model.layers.{i}.mamba.conv1d",),
    "mamba_dt_bias": ("model.layers.{i}.mamba.dt_bias",),
    "mamba_a_log": ("model.layers.{i}.mamba.A_log",),
    "mamba_d": ("model.layers.{i}.mamba.D",),
    "mamba_norm": ("model.layers.{i}.mamba.norm",),
    "mamba_out": ("model.layers.{i}.mamba.out_proj",),
}


# layer kinds as transformers 5 names them (it reads the released configs' "mamba" and
# "attention" as these)
MAMBA_LAYER, ATTENTION_LAYER = "linear_attention", "full_attention"


def layer_kinds(
    kinds: Sequence[str] | None, num_layers: int, known: Sequence[str] = (ATTENTION_LAYER,)
) -> list[str]:
    """Each layer's kind (None: every layer Mamba, as transformers defaults), refused naming any
    kind outside Mamba and `known`."""
    kinds = list(kinds or [MAMBA_LAYER] * num_layers)
    unknown = set(kinds) - {MAMBA_LAYER, *known}
    if unknown:
        raise UnsupportedArchitectureError(f"layer_types {sorted(unknown)} are not supported")
    if len(kinds) != num_layers:
        raise UnsupportedArchitectureError(
            f"layer_types names {len(kinds)} layers, not num_hidden_layers {num_layers}"
        )
    return kinds


def checked(cfg: MambaConfig, conv_act: str) -> MambaConfig:
    """`cfg`, refused where its groups cannot share out its heads or its conv's activation is
    not the SiLU the kernels have (transformers applies the config's)."""
    if cfg.num_heads % cfg.num_groups:
        raise UnsupportedArchitectureError(
            f"{cfg.num_groups} Mamba groups do not divide its {cfg.num_heads} heads"
        )
    if conv_act not in ("silu", "swish"):
        raise UnsupportedArchitectureError(f"activation {conv_act!r}: the Mamba conv is SiLU")
    return cfg


def mamba_config(
    raw: dict[str, Any], kinds: Sequence[str] | None, config: ModelConfig
) -> MambaConfig:
    """config.json's mamba_* fields (Granite 4.0's, Bamba's, Falcon-H1's) with each layer's
    kind; the inner width mamba_d_ssm where the config gives it (Falcon-H1), else
    mamba_expand x hidden_size."""
    kinds = layer_kinds(kinds, config.num_layers)
    heads = raw["mamba_n_heads"]
    inner = raw.get("mamba_d_ssm") or int(raw.get("mamba_expand", 2) * config.hidden_size)
    head_dim = raw.get("mamba_d_head")
    if head_dim in (None, "auto"):
        head_dim = inner // heads
    if head_dim * heads != inner:
        raise UnsupportedArchitectureError(
            f"mamba_d_head {head_dim} x mamba_n_heads {heads} is not the inner width {inner} "
            "(mamba_d_ssm, or mamba_expand x hidden_size)"
        )
    limit = raw.get("time_step_limit") or (0.0, float("inf"))
    cfg = MambaConfig(
        layers=tuple(kind == MAMBA_LAYER for kind in kinds),
        num_heads=heads,
        head_dim=head_dim,
        num_groups=raw.get("mamba_n_groups") or 1,
        state_size=raw["mamba_d_state"],
        conv_kernel=raw.get("mamba_d_conv") or 4,
        conv_bias=bool(raw.get("mamba_conv_bias", True)),
        proj_bias=bool(raw.get("mamba_proj_bias", False)),
        time_step_limit=(float(limit[0]), float(limit[1])),
    )
    return checked(cfg, raw.get("hidden_act", "silu"))


class _RankSlice:
    """This rank's heads and the groups they belong to, with the offsets of each in the conv's
    and in_proj's channel layout."""

    def __init__(self, cfg: MambaConfig, dist: Distributed) -> None:
        heads, groups, world = cfg.num_heads, cfg.num_groups, dist.world_size
        if heads % world or (groups % world and world % groups):
            raise WeightsError(
                f"{world} shards cannot split the Mamba mixer's {heads} heads in {groups} groups "
                "(mamba_n_heads, mamba_n_groups): the shard count must divide the heads, and "
                "divide the groups or be a multiple of them"
            )
        self.heads = range(*head_range(heads, dist.rank, world, replicate=False))
        per_group = heads // groups
        self.groups = range(self.heads.start // per_group, (self.heads.stop - 1) // per_group + 1)
        # the norm's groups are whole on this rank, or shared with others (fewer groups than
        # ranks): then their sums of squares are all-reduced
        self.norm_groups_span_ranks = world > groups
        self.cfg = cfg

    def conv_spans(self) -> list[tuple[int, int]]:
        """This rank's x, B and C channels within the conv's (x of all heads, B, C)."""
        p, n, inner = self.cfg.head_dim, self.cfg.state_size, self.cfg.intermediate_size
        bc = self.cfg.num_groups * n
        g = self.groups
        return [
            (self.heads.start * p, self.heads.stop * p),
            (inner + g.start * n, inner + g.stop * n),
            (inner + bc + g.start * n, inner + bc + g.stop * n),
        ]

    def in_proj_pieces(self, name: str) -> list[Piece]:
        """in_proj's rows are [z | conv channels | dt]: this rank's z, x, B, C and dt."""
        inner = self.cfg.intermediate_size
        conv_channels = inner + 2 * self.cfg.num_groups * self.cfg.state_size
        p = self.cfg.head_dim
        z = Piece(name, self.heads.start * p, self.heads.stop * p)
        conv = [Piece(name, inner + a, inner + b) for a, b in self.conv_spans()]
        dt_start = inner + conv_channels
        dt = Piece(name, dt_start + self.heads.start, dt_start + self.heads.stop)
        return [z, *conv, dt]

    def projection_scale(self) -> torch.Tensor | None:
        """Falcon-H1's scales of in_proj's parts (z, x, B, C, dt) over this rank's rows, in
        their order [z | x | B | C | dt], float32; None without them."""
        scales = self.cfg.projection_scales
        if not scales:
            return None
        p, n = self.cfg.head_dim, self.cfg.state_size
        heads, groups = len(self.heads), len(self.groups)
        widths = (heads * p, heads * p, groups * n, groups * n, heads)
        return torch.cat([torch.full((w,), float(s)) for w, s in zip(widths, scales, strict=True)])

    def shape(self) -> LinearShape:
        cfg = self.cfg
        return LinearShape(
            key_heads=len(self.groups), value_heads=len(self.heads), key_dim=cfg.state_size,
            value_dim=cfg.head_dim, conv_kernel=cfg.conv_kernel,
        )  # fmt: skip


class Mamba2Mixer(RecurrentMixer):
    def __init__(
        self,
        in_proj: ColumnParallelLinear,
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor | None,
        dt_bias: torch.Tensor,
        a_log: torch.Tensor,
        d: torch.Tensor,
        norm_weight: torch.Tensor | None,
        out_proj: RowParallelLinear,
        ranks: _RankSlice,
        eps: float,
        dist: Distributed,
    ) -> None:
        super().__init__()
        self.in_proj = in_proj  # [z | x | B | C | dt] of this rank's heads and groups
        self.register_buffer("conv_weight", conv_weight, persistent=False)  # [channels, K]
        self.register_buffer("conv_bias", conv_bias, persistent=False)
        self.register_buffer("dt_bias", dt_bias, persistent=False)
        # the decay's scale, -exp(A_log), in float32 as transformers computes it
        self.register_buffer("neg_a", -a_log.float().exp(), persistent=False)
        self.register_buffer("d", d, persistent=False)
        self.register_buffer(
            "norm_weight", None if norm_weight is None else norm_weight.float(), persistent=False
        )
        # Falcon-H1's per-part scales of in_proj's outputs, over this rank's rows (float32, as
        # transformers multiplies them); None: none
        scale = ranks.projection_scale()
        scale = None if scale is None else scale.to(d.device)
        self.register_buffer("projection_scale", scale, persistent=False)
        self.gate_norm = ranks.cfg.gate_norm
        self.out_proj = out_proj
        self.shape = ranks.shape()
        cfg = ranks.cfg
        self.time_step_limit = cfg.time_step_limit
        self.heads_per_group = cfg.num_heads // cfg.num_groups
        self.group_offset = ranks.groups.start  # this rank's first group, of all groups
        self.num_groups = cfg.num_groups
        self.norm_groups_span_ranks = ranks.norm_groups_span_ranks
        self.eps = eps
        self.dist = dist

    @classmethod
    def load(cls, weights: Weights, names: Names, config: ModelConfig) -> Mamba2Mixer:
        cfg = config.mamba
        assert cfg is not None
        ranks = _RankSlice(cfg, weights.dist)
        in_name, conv = names.one("mamba_in"), names.one("mamba_conv")
        pieces = ranks.in_proj_pieces(in_name)
        in_proj = ColumnParallelLinear(
            *ColumnParallelLinear.load_pieces(weights, pieces, bias=cfg.proj_bias)
        )._record(weights, pieces)
        spans = ranks.conv_spans()
        conv_weight = torch.cat(
            [weights.get_range(f"{conv}.weight", 0, a, b) for a, b in spans]
        ).flatten(1)  # [channels, 1, K] -> [channels, K]
        if conv_weight.shape[1] != cfg.conv_kernel:
            raise WeightsError(
                f"{conv}.weight has a kernel of {conv_weight.shape[1]}, the config says "
                f"{cfg.conv_kernel} (mamba_d_conv)"
            )
        conv_bias = None
        if cfg.conv_bias:
            conv_bias = torch.cat([weights.get_range(f"{conv}.bias", 0, a, b) for a, b in spans])
        heads = ranks.heads
        p = cfg.head_dim

        def per_head(ours: str) -> torch.Tensor:
            return weights.get_range(names.one(ours), 0, heads.start, heads.stop)

        norm = None
        if cfg.gate_norm != "gate":
            norm_name = f"{names.one('mamba_norm')}.weight"
            norm = weights.get_range(norm_name, 0, heads.start * p, heads.stop * p)
        out_bias = cfg.proj_bias if cfg.out_bias is None else cfg.out_bias
        return cls(
            in_proj,
            conv_weight,
            conv_bias,
            per_head("mamba_dt_bias"),
            per_head("mamba_a_log"),
            per_head("mamba_d"),
            norm,
            RowParallelLinear.load(weights, names.one("mamba_out"), bias=out_bias),
            ranks,
            config.rms_norm_eps,
            weights.dist,
        )

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: RecurrentState,
        meta: StepMetadata,
    ) -> torch.Tensor:
        s = self.shape
        inner, heads = s.value_heads * s.value_dim, s.value_heads
        projected = self.in_proj(hidden)
        if self.projection_scale is not None:
            projected = projected * self.projection_scale
        z, xbc, dt = projected.split([inner, s.conv_channels, heads], dim=-1)
        step = time_steps(dt, self.dt_bias, self.time_step_limit)
        y = torch.empty(hidden.shape[0], heads, s.value_dim, dtype=torch.float32,
                        device=hidden.device)  # fmt: skip
        bc = s.key_heads * s.key_dim
        for part, start, stop in step_parts(meta, hidden.shape[0]):
            conv = self._conv(xbc[start:stop], cache, part)
            x, b, c = conv.split([inner, bc, bc], dim=-1)
            y[start:stop] = self._scan(
                x.unflatten(-1, (heads, s.value_dim)),
                step[start:stop],
                b.unflatten(-1, (s.key_heads, s.key_dim)),
                c.unflatten(-1, (s.key_heads, s.key_dim)),
                cache,
                part,
            )
        # (in the input's dtype: Falcon-H1's scaled z is float32, as transformers has it)
        return self.out_proj(self._gated_norm(y.flatten(1), z).to(hidden.dtype))

    def _scan(
        self,
        x: torch.Tensor,
        step: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        cache: RecurrentState,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        slots = state_slots(meta)
        if meta.is_prefill:
            return ssd_prefill(
                x, step, b, c, self.neg_a, self.d, cache.state, slots,
                list(meta.host_query_lens), list(meta.host_fresh),
            )  # fmt: skip
        return ssd_decode(x, step, b, c, self.neg_a, self.d, cache.state, slots)

    def _gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y [T, heads * head_dim] float32 times silu(z), RMS-normed per group of heads (the
        gate before the norm: transformers' RMSNormGated, norm_before_gate False), times the
        weight, rounded once to z's dtype. `gate_norm` "norm_then_gate": the norm of y first,
        then the gate; "gate": the gate alone (Falcon-H1's options)."""
        if self.gate_norm == "gate":
            return (y * F.silu(z.float())).to(z.dtype)
        if self.gate_norm == "norm_then_gate":
            return (self._normed(y) * F.silu(z.float())).to(z.dtype)
        return self._normed(y * F.silu(z.float())).to(z.dtype)

    def _normed(self, gated: torch.Tensor) -> torch.Tensor:
        """float32 [T, heads * head_dim] RMS-normed per group of heads, times the weight."""
        per_group = self.heads_per_group * self.shape.value_dim
        if not self.norm_groups_span_ranks:
            grouped = gated.unflatten(-1, (-1, per_group))
            mean_square = grouped.pow(2).mean(-1, keepdim=True)
        else:
            # this rank's heads are part of one group: its share of that group's sum of squares,
            # summed over the ranks (zeros for the others' groups)
            grouped = gated.unflatten(-1, (1, -1))
            sums = gated.new_zeros(gated.shape[0], self.num_groups)
            sums[:, self.group_offset] = gated.pow(2).sum(-1)
            sums = self.dist.all_reduce(sums)[:, self.group_offset : self.group_offset + 1]
            mean_square = (sums / per_group).unsqueeze(-1)
        normed = (grouped * torch.rsqrt(mean_square + self.eps)).flatten(-2)
        return self.norm_weight * normed
