"""The floating-point method: `{prefix}.weight` [out, in] in the model's dtype."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from shard.layers.quant.base import LinearWeight, Piece
from shard.platforms import platform_of
from shard.weights import Weights


class DenseWeight(LinearWeight):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # the platform's layout: packed for the CPU's oneDNN or AMX tile kernel, else as read
        self.ops = platform_of(weight.device)
        self.weight = nn.Parameter(self.ops.prepare_weight(weight), requires_grad=False)

    def unpack(self) -> None:
        """The plain weight again, for torch.compile (shard/platforms/cpu/compiled.py), which packs
        it itself and cannot trace oneDNN's opaque packed tensors."""
        self.weight = nn.Parameter(self.ops.dense(self.weight.data), requires_grad=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.ops.linear(x, self.weight, bias)

    def gated(self, x: torch.Tensor, bias: torch.Tensor | None, act: str) -> torch.Tensor:
        fused = self.ops.gated_linear(x, self.weight, bias, act)
        return super().gated(x, bias, act) if fused is None else fused


class UnquantizedMethod:
    def out_features(self, weights: Weights, prefix: str) -> int:
        return weights.shape(f"{prefix}.weight")[0]

    def in_features(self, weights: Weights, prefix: str) -> int:
        return weights.shape(f"{prefix}.weight")[1]

    def check_row_split(self, weights: Weights, prefix: str) -> None:
        pass  # any equal split of a dense matrix works (Weights checks divisibility)

    def load_columns(self, weights: Weights, pieces: Sequence[Piece]) -> DenseWeight:
        names = [(f"{p.prefix}.weight", p.start, p.stop) for p in pieces]
        return DenseWeight(weights.get_concat(names, 0))

    def load_rows(self, weights: Weights, piece: Piece) -> DenseWeight:
        return DenseWeight(weights.get_range(f"{piece.prefix}.weight", 1, piece.start, piece.stop))
