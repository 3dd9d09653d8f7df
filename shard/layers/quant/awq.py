"""AutoAWQ "GEMM" checkpoints.

qweight int32 [in, out / 8]        8 codes per int32 along the output features, in AWQ's
                                   interleaved order: nibble i holds column AWQ_ORDER[i]
qzeros  int32 [in / group, out / 8] the same packing
scales  fp16  [in / group, out]
weight[k, n] = (code[k, n] - zero[k // group, n]) * scale[k // group, n]
"""

from __future__ import annotations

import torch

from shard.layers.quant.int4 import QuantizedWeight, pack_rows
from shard.layers.quant.reader import FeatureRange, read_part
from shard.weights import Weights

PACK = 8
# AutoAWQ's packer puts output column AWQ_ORDER[i] of each group of 8 into nibble i.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SHIFTS = torch.tensor([4 * AWQ_ORDER.index(j) for j in range(PACK)], dtype=torch.int32)


def unpack_columns(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C / 8] in AWQ order -> uint8 [R, C] with column j at position j."""
    rows, words = packed.shape
    codes = (packed.unsqueeze(-1) >> _SHIFTS.to(packed.device)) & 0xF
    return codes.reshape(rows, words * PACK).to(torch.uint8)


class AwqReader:
    tensors = ("qweight", "qzeros", "scales")

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def out_features(self, weights: Weights, prefix: str) -> int:
        return weights.shape(f"{prefix}.qweight")[1] * PACK

    def in_features(self, weights: Weights, prefix: str) -> int:
        return weights.shape(f"{prefix}.qweight")[0]

    def read(
        self, weights: Weights, prefix: str, rows: FeatureRange, cols: FeatureRange
    ) -> QuantizedWeight:
        g = self.group_size
        qweight, qzeros, scales = (f"{prefix}.{t}" for t in self.tensors)
        # Column pieces (fused q/k/v, gate/up, a shard's outputs) must be whole int32 words.
        codes = read_part(weights, qweight, rows, cols.packed(PACK, qweight))
        zeros = read_part(weights, qzeros, rows.packed(g, qzeros), cols.packed(PACK, qzeros))
        scales = read_part(weights, scales, rows.packed(g, scales), cols)
        return QuantizedWeight(
            qweight=pack_rows(unpack_columns(codes)),
            zeros=unpack_columns(zeros),
            scales=scales,
            group_size=g,
        )
