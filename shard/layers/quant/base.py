"""The interface the tensor-parallel linears hold: one LinearMethod per checkpoint format.

A method knows, for one format, which checkpoint tensors hold a module's weight, how to read
only this rank's slice of them, how to repack them, and what multiplies with the result. The TP
linears (shard/layers/linear.py) decide the slices, in features: column layers take ranges of
output features (several pieces for fused q/k/v or gate/up), row layers one range of input
features. Offsets in features, not in packed int32 words, are what every method shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from shard.layers.activation import act_and_mul
from shard.weights import Weights


@dataclass(frozen=True)
class Piece:
    """Features [start, stop) of checkpoint module `prefix` (e.g. model.layers.0.mlp.up_proj):
    output features for a column layer, input features for a row layer."""

    prefix: str
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


class LinearWeight(nn.Module):
    """A linear layer's weight in some representation; `forward(x, bias)` = x @ W.T + bias."""

    in_features: int
    out_features: int

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def gated(self, x: torch.Tensor, bias: torch.Tensor | None, act: str) -> torch.Tensor:
        """act(gate) * up where the product's first half of outputs is the gate and the second
        the up (a fused gate_up projection); `act` a name of activation.GATED_ACTIVATIONS.
        Representations that can fuse an activation into the product override this; the values
        are the same either way."""
        return act_and_mul(self(x, bias), act)


class LinearMethod(Protocol):
    def out_features(self, weights: Weights, prefix: str) -> int: ...

    def in_features(self, weights: Weights, prefix: str) -> int: ...

    def check_row_split(self, weights: Weights, prefix: str) -> None:
        """Raises WeightsError when this rank's equal share of the input features cannot be
        cut out of the checkpoint's layout (e.g. not on a group boundary)."""

    def load_columns(self, weights: Weights, pieces: Sequence[Piece]) -> LinearWeight:
        """Output-feature pieces, concatenated in order; every input feature."""

    def load_rows(self, weights: Weights, piece: Piece) -> LinearWeight:
        """One range of input features; every output feature."""
