"""The Mamba 1 mixer (transformers' `MambaMixer`; FalconMamba's and Jamba's add RMS norms on the
time step, B and C).

in_proj gives, per token, the inner channels x and the gate z. x goes through the causal conv
(SiLU after; shard/layers/causal_conv.py), x_proj maps the result to a low-rank time step and
the token's B and C, dt_proj widens the time step back to one per channel, and the selective
scan (shard/layers/selective_scan.py) gives y, which times silu(z) is projected back by out_proj.

A sequence's state is its last conv inputs and a [state_size] vector per channel, in the
RecurrentState pools the other recurrent mixers use (shard/models/linear_attention.py: a
LinearShape of one "value head" per channel, each of one value and `state_size` keys, and no
key channels in the conv), so state slots, chunked prefill, CUDA graphs and the CPU decode loop
serve it as they serve Mamba 2's.

Tensor parallel splits the inner channels: each rank reads its share of x and z (in_proj's
rows), the conv's channels, x_proj's input columns (a row-parallel linear: the time step, B and
C are sums over every channel, so one all-reduce gives each rank all of them), dt_proj's rows,
A and D, and out_proj's input columns (one all-reduce more).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from shard.attention import AttentionMetadata, StepMetadata
from shard.layers.linear import ColumnParallelLinear, RowParallelLinear
from shard.layers.norm import RMSNorm
from shard.layers.quant.base import Piece
from shard.layers.selective_scan import selective_scan_decode, selective_scan_prefill
from shard.layers.ssd import time_steps
from shard.models.config import Mamba1Config, ModelConfig, UnsupportedArchitectureError
from shard.models.linear_attention import (
    LinearShape,
    RecurrentMixer,
    RecurrentState,
    state_slots,
    step_parts,
)
from shard.models.names import Names
from shard.weights import Weights, WeightsError

# The norms on x_proj's outputs (Mamba1Config.bcdt_norm)
NO_NORM, WEIGHTLESS_NORM, WEIGHTED_NORM = "", "weightless", "weighted"
_NO_STEP_LIMIT = (0.0, float("inf"))


def mamba1_names(mixer: str) -> dict[str, tuple[str, ...]]:
    """Our names of a Mamba 1 mixer's modules -> the checkpoint's, under `mixer` (with `{i}`
    for the layer: Mamba's `backbone.layers.{i}.mixer`, Jamba's `model.layers.{i}.mamba`)."""
    parts = {
        "mamba1_in": "in_proj", "mamba1_conv": "conv1d", "mamba1_x": "x_proj",
        "mamba1_dt": "dt_proj", "mamba1_a_log": "A_log", "mamba1_d": "D",
        "mamba1_out": "out_proj", "mamba1_dt_norm": "dt_layernorm",
        "mamba1_b_norm": "b_layernorm", "mamba1_c_norm": "c_layernorm",
    }  # fmt: skip
    return {ours: (f"{mixer}.{theirs}",) for ours, theirs in parts.items()}


def mamba1_config(
    layers: Sequence[bool],
    *,
    intermediate_size: int,
    state_size: int,
    dt_rank: int | str,
    hidden_size: int,
    conv_kernel: int,
    conv_bias: bool,
    proj_bias: bool,
    conv_act: str,
    bcdt_norm: str = NO_NORM,
    norm_eps: float = 1e-6,
) -> Mamba1Config:
    """The mixers' shapes, refused where the conv's activation is not the SiLU the layer has
    (transformers applies the config's); dt_rank "auto" is ceil(hidden_size / 16), as
    transformers reads it."""
    if conv_act not in ("silu", "swish"):
        raise UnsupportedArchitectureError(f"activation {conv_act!r}: the Mamba conv is SiLU")
    rank = -(-hidden_size // 16) if dt_rank == "auto" else int(dt_rank)
    return Mamba1Config(
        layers=tuple(layers),
        intermediate_size=int(intermediate_size),
        state_size=int(state_size),
        dt_rank=rank,
        conv_kernel=int(conv_kernel),
        conv_bias=bool(conv_bias),
        proj_bias=bool(proj_bias),
        bcdt_norm=bcdt_norm,
        norm_eps=float(norm_eps),
    )


def _channels(cfg: Mamba1Config, weights: Weights) -> tuple[int, int]:
    """This rank's inner channels [start, stop), as the row-parallel linears cut their input."""
    world = weights.dist.world_size
    if cfg.intermediate_size % world:
        raise WeightsError(
            f"{world} shards cannot split the Mamba mixer's {cfg.intermediate_size} inner "
            "channels (expand x hidden_size): the shard count must divide them"
        )
    return weights.shard_bounds("the Mamba mixer's channels", 0, cfg.intermediate_size)


def _bcdt_norms(
    weights: Weights, names: Names, cfg: Mamba1Config
) -> tuple[RMSNorm, RMSNorm, RMSNorm] | None:
    """The norms of the time step, B and C: Jamba's weighted ones, FalconMamba's without a
    weight (ones: x * 1 is exact, so Llama's norm computes them as transformers does)."""
    if cfg.bcdt_norm == NO_NORM:
        return None
    widths = (cfg.dt_rank, cfg.state_size, cfg.state_size)
    if cfg.bcdt_norm == WEIGHTLESS_NORM:
        device, dtype = weights.device, weights.dtype
        ones = [RMSNorm(torch.ones(w, dtype=dtype, device=device), cfg.norm_eps) for w in widths]
        return ones[0], ones[1], ones[2]
    dt, b, c = (
        RMSNorm.load(weights, names.one(ours), cfg.norm_eps)
        for ours in ("mamba1_dt_norm", "mamba1_b_norm", "mamba1_c_norm")
    )
    return dt, b, c


class Mamba1Mixer(RecurrentMixer):
    def __init__(
        self,
        in_proj: ColumnParallelLinear,
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor | None,
        x_proj: RowParallelLinear,
        dt_proj: ColumnParallelLinear,
        dt_bias: torch.Tensor,
        a_log: torch.Tensor,
        d: torch.Tensor,
        out_proj: RowParallelLinear,
        norms: tuple[RMSNorm, RMSNorm, RMSNorm] | None,
        cfg: Mamba1Config,
    ) -> None:
        super().__init__()
        self.in_proj = in_proj  # [x | z] of this rank's channels
        self.register_buffer("conv_weight", conv_weight, persistent=False)  # [channels, K]
        self.register_buffer("conv_bias", conv_bias, persistent=False)
        self.x_proj = x_proj  # this rank's channels -> [dt_rank | B | C], all-reduced
        self.dt_proj = dt_proj  # dt_rank -> this rank's channels (its bias added in float32)
        self.register_buffer("dt_bias", dt_bias, persistent=False)
        # the decay's scale, -exp(A_log) [channels, state], in float32 as transformers has it
        self.register_buffer("neg_a", -a_log.float().exp(), persistent=False)
        self.register_buffer("d", d, persistent=False)
        self.out_proj = out_proj
        # RMS norms of the time step, B and C (FalconMamba, Jamba); None: none
        self.norms = None if norms is None else torch.nn.ModuleList(norms)
        self.split_sizes = [cfg.dt_rank, cfg.state_size, cfg.state_size]
        channels = conv_weight.shape[0]
        self.shape = LinearShape(
            key_heads=0, value_heads=channels, key_dim=cfg.state_size, value_dim=1,
            conv_kernel=cfg.conv_kernel,
        )  # fmt: skip

    @classmethod
    def load(cls, weights: Weights, names: Names, config: ModelConfig) -> Mamba1Mixer:
        cfg = config.mamba1
        assert cfg is not None
        first, last = _channels(cfg, weights)
        inner = cfg.intermediate_size
        in_name, conv = names.one("mamba1_in"), names.one("mamba1_conv")
        pieces = [Piece(in_name, first, last), Piece(in_name, inner + first, inner + last)]
        in_proj = ColumnParallelLinear(
            *ColumnParallelLinear.load_pieces(weights, pieces, bias=cfg.proj_bias)
        )._record(weights, pieces)
        conv_weight = weights.get_range(f"{conv}.weight", 0, first, last).flatten(1)
        if conv_weight.shape[1] != cfg.conv_kernel:
            raise WeightsError(
                f"{conv}.weight has a kernel of {conv_weight.shape[1]}, the config says "
                f"{cfg.conv_kernel}"
            )
        conv_bias = None
        if cfg.conv_bias:
            conv_bias = weights.get_range(f"{conv}.bias", 0, first, last)
        dt = names.one("mamba1_dt")
        # transformers adds dt_proj's bias in float32 apart from the product: read it apart
        dt_proj = ColumnParallelLinear.load_rows(weights, Piece(dt, first, last), bias=False)

        def channel_rows(ours: str) -> torch.Tensor:
            return weights.get_range(names.one(ours), 0, first, last)

        return cls(
            in_proj,
            conv_weight,
            conv_bias,
            RowParallelLinear.load(weights, names.one("mamba1_x"), bias=False),
            dt_proj,
            weights.get_range(f"{dt}.bias", 0, first, last),
            channel_rows("mamba1_a_log"),
            channel_rows("mamba1_d"),
            RowParallelLinear.load(weights, names.one("mamba1_out"), bias=cfg.proj_bias),
            _bcdt_norms(weights, names, cfg),
            cfg,
        )

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: RecurrentState,
        meta: StepMetadata,
    ) -> torch.Tensor:
        x, z = self.in_proj(hidden).chunk(2, dim=-1)
        parts = step_parts(meta, hidden.shape[0])
        conv = torch.empty_like(x)
        for part, start, stop in parts:
            conv[start:stop] = self._conv(x[start:stop], cache, part)
        # every token's time step, B and C at once: one all-reduce for the step
        step, b, c = self.x_proj(conv).split(self.split_sizes, dim=-1)
        if self.norms is not None:
            # (contiguous: the norms' kernels read whole rows)
            step, b, c = (n(t.contiguous()) for n, t in zip(self.norms, (step, b, c), strict=True))
        step = time_steps(self.dt_proj(step), self.dt_bias, _NO_STEP_LIMIT)
        y = torch.empty(conv.shape, dtype=torch.float32, device=hidden.device)
        for part, start, stop in parts:
            rows = slice(start, stop)
            y[rows] = self._scan(conv[rows], step[rows], b[rows], c[rows], cache, part)
        return self.out_proj((y * F.silu(z.float())).to(hidden.dtype))

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
        states = cache.state.squeeze(-1)  # [slots, channels, state] (a view: written through)
        if meta.is_prefill:
            return selective_scan_prefill(
                x, step, self.neg_a, b, c, self.d, states, slots,
                list(meta.host_query_lens), list(meta.host_fresh),
            )  # fmt: skip
        return selective_scan_decode(x, step, self.neg_a, b, c, self.d, states, slots)
