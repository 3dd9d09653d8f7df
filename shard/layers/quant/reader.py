"""Reading part of a packed checkpoint tensor, addressed in features.

The TP linears hand a format reader ranges of input and output features; the reader turns them
into ranges of its tensors' rows and columns (packed int32 words, groups) with `packed`, and
`read_part` checks the tensor's shape against what the format and config imply, so that a
checkpoint that disagrees with its `group_size` fails naming the tensor instead of loading
garbage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shard.weights import Weights, WeightsError


@dataclass(frozen=True)
class FeatureRange:
    start: int
    stop: int
    total: int

    @classmethod
    def whole(cls, total: int) -> FeatureRange:
        return cls(0, total, total)

    @property
    def is_whole(self) -> bool:
        return self.start == 0 and self.stop == self.total

    def packed(self, factor: int, tensor: str) -> FeatureRange:
        """The same range in units of `factor` features (an int32 word, a group) of `tensor`,
        which the error names when the range cuts one of those units."""
        if self.start % factor or self.stop % factor:
            raise WeightsError(
                f"{tensor}: features {self.start}:{self.stop} (of {self.total}) do not fall on "
                f"boundaries of {factor} (its packed words or quantization groups), so this "
                "shard's part cannot be cut out of it"
            )
        return FeatureRange(self.start // factor, self.stop // factor, -(-self.total // factor))


def read_part(weights: Weights, name: str, rows: FeatureRange, cols: FeatureRange) -> torch.Tensor:
    """`name[rows, cols]` in its stored dtype; the tensor must be [rows.total, cols.total]."""
    shape = weights.shape(name)
    if shape != [rows.total, cols.total]:
        raise WeightsError(
            f"{name} has shape {shape}, but the layer's features and the quantization config "
            f"(bits, group_size) imply {[rows.total, cols.total]}"
        )
    if not rows.is_whole and not cols.is_whole:
        raise WeightsError(f"{name}: cannot slice rows and columns at once")
    dim, part = (1, cols) if rows.is_whole else (0, rows)
    return weights.get_range(name, dim, part.start, part.stop, stored_dtype=True)


def read_vector(weights: Weights, name: str, part: FeatureRange) -> torch.Tensor:
    """`name[part]` of a 1-D tensor of `part.total` elements."""
    shape = weights.shape(name)
    if shape != [part.total]:
        raise WeightsError(f"{name} has shape {shape}, expected {[part.total]}")
    return weights.get_range(name, 0, part.start, part.stop, stored_dtype=True)
