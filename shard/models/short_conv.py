"""LFM2's gated short convolution (transformers' `Lfm2ShortConv`), the mixer of the layers LFM2's
`layer_types` name "conv".

One input projection gives, per token, B, C and x (each hidden_size wide); B * x goes through a
causal depthwise convolution of `conv_L_cache` taps (no activation after it), the result is
gated by C and projected back by out_proj. A sequence's state is its last conv_L_cache - 1
inputs, in the RecurrentState pools the other recurrent mixers use (shard/models/
linear_attention.py: a LinearShape of one "value head" as wide as this rank's channels and no
matrix state), so state slots, chunked prefill, CUDA graphs and the CPU decode loop serve it as
they serve Mamba 2's.

Tensor parallel splits the channels: each rank reads its share of B, C and x (in_proj's rows),
of the conv's channels and of out_proj's input columns (one all-reduce a layer).
"""

from __future__ import annotations

import torch

from shard.attention import StepMetadata
from shard.layers.linear import ColumnParallelLinear, RowParallelLinear, head_range
from shard.layers.quant.base import Piece
from shard.models.config import ModelConfig
from shard.models.linear_attention import LinearShape, RecurrentMixer, RecurrentState, step_parts
from shard.models.names import Names
from shard.weights import Weights, WeightsError

# Our names of a short convolution's modules -> the checkpoint's (LFM2's)
SHORT_CONV_NAMES: dict[str, tuple[str, ...]] = {
    "conv_in": ("model.layers.{i}.conv.in_proj",),
    "conv_weight": ("model.layers.{i}.conv.conv",),
    "conv_out": ("model.layers.{i}.conv.out_proj",),
}


class ShortConv(RecurrentMixer):
    conv_silu = False

    def __init__(
        self,
        in_proj: ColumnParallelLinear,
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor | None,
        out_proj: RowParallelLinear,
        kernel: int,
    ) -> None:
        super().__init__()
        self.in_proj = in_proj  # [B | C | x] of this rank's channels
        self.register_buffer("conv_weight", conv_weight, persistent=False)  # [channels, K]
        self.register_buffer("conv_bias", conv_bias, persistent=False)
        self.out_proj = out_proj
        channels = conv_weight.shape[0]
        self.shape = LinearShape(
            key_heads=0, value_heads=1, key_dim=0, value_dim=channels, conv_kernel=kernel
        )

    @classmethod
    def load(cls, weights: Weights, names: Names, config: ModelConfig) -> ShortConv:
        cfg = config.short_conv
        assert cfg is not None
        dist, hidden = weights.dist, config.hidden_size
        if hidden % dist.world_size:
            raise WeightsError(
                f"{dist.world_size} shards cannot split the short convolution's {hidden} "
                "channels (hidden_size): the shard count must divide them"
            )
        first, last = head_range(hidden, dist.rank, dist.world_size, replicate=False)
        in_name, conv = names.one("conv_in"), names.one("conv_weight")
        # in_proj's rows are [B | C | x]: this rank's channels of each
        pieces = [Piece(in_name, part * hidden + first, part * hidden + last) for part in range(3)]
        in_proj = ColumnParallelLinear(
            *ColumnParallelLinear.load_pieces(weights, pieces, bias=cfg.bias)
        )._record(weights, pieces)
        conv_weight = weights.get_range(f"{conv}.weight", 0, first, last).flatten(1)
        if conv_weight.shape[1] != cfg.kernel:
            raise WeightsError(
                f"{conv}.weight has a kernel of {conv_weight.shape[1]}, the config says "
                f"{cfg.kernel} (conv_L_cache)"
            )
        conv_bias = weights.get_range(f"{conv}.bias", 0, first, last) if cfg.bias else None
        out_proj = RowParallelLinear.load(weights, names.one("conv_out"), bias=cfg.bias)
        return cls(in_proj, conv_weight, conv_bias, out_proj, cfg.kernel)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: RecurrentState,
        meta: StepMetadata,
    ) -> torch.Tensor:
        b, c, x = self.in_proj(hidden).chunk(3, dim=-1)
        gated = b * x
        conv = torch.empty_like(gated)
        for part, start, stop in step_parts(meta, hidden.shape[0]):
            conv[start:stop] = self._conv(gated[start:stop], cache, part)
        return self.out_proj(c * conv)
