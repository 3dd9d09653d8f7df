"""The floating-point method: `{prefix}.weight` [out, in] in the model's dtype."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from shard.layers import matmul_amx
from shard.layers.activation import SILU
from shard.layers.matmul import dense, linear, prepare_weight
from shard.layers.quant.base import LinearWeight, Piece
from shard.weights import Weights


class DenseWeight(LinearWeight):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(prepare_weight(weight), requires_grad=False)

    def unpack(self) -> None:
        """The plain weight again, for torch.compile (shard/compiled.py), which packs it itself
        and cannot trace oneDNN's opaque packed tensors."""
        self.weight = nn.Parameter(dense(self.weight.data), requires_grad=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear(x, self.weight, bias)

    def gated(self, x: torch.Tensor, bias: torch.Tensor | None, act: str) -> torch.Tensor:
        if act == SILU and matmul_amx.is_packed(self.weight):  # SwiGLU in the tile epilogue
            return matmul_amx.linear_silu_mul(x, self.weight, bias)
        return super().gated(x, bias, act)


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
