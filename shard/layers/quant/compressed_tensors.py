"""compressed-tensors `pack-quantized` checkpoints (llm-compressor's W4A16), group or channel.

    weight_packed      int32 [out, in / 8]      8 codes per int32 along the input features, in
                                                order; a code is the signed value + 8
    weight_scale       [out, groups]            groups = in / group_size, or 1 per channel
    weight_zero_point  int32 [out / 8, groups]  asymmetric only: packed along the outputs, + 8
    weight_shape       int [2]                  (out, in) before packing
    weight[n, k] = (signed_code[n, k] - signed_zero[n, g(k)]) * scale[n, g(k)]

In our unsigned layout both code and zero keep the + 8, which leaves their difference unchanged;
a symmetric checkpoint's zero is 0, i.e. 8 unsigned.
"""

from __future__ import annotations

import torch

from shard.layers.quant.int4 import QuantizedWeight, unpack_rows
from shard.layers.quant.reader import FeatureRange, read_part
from shard.weights import Weights, WeightsError

PACK = 8
OFFSET = 8  # 2^(bits - 1): signed int4 stored unsigned


class CompressedTensorsReader:
    tensors = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")

    def __init__(self, group_size: int, zero_point: bool) -> None:
        self.group_size = group_size  # -1: channel strategy, one group spans the input
        self.zero_point = zero_point

    def _shape(self, weights: Weights, prefix: str) -> tuple[int, int]:
        name = f"{prefix}.weight_shape"
        shape = weights.get_tensor(name).tolist()
        if len(shape) != 2:
            raise WeightsError(f"{name} = {shape}: expected (out_features, in_features)")
        return int(shape[0]), int(shape[1])

    def out_features(self, weights: Weights, prefix: str) -> int:
        return self._shape(weights, prefix)[0]

    def in_features(self, weights: Weights, prefix: str) -> int:
        return self._shape(weights, prefix)[1]

    def read(
        self, weights: Weights, prefix: str, rows: FeatureRange, cols: FeatureRange
    ) -> QuantizedWeight:
        if self.group_size == -1:  # channel: one scale per output, whatever rows we take
            group_size, groups = rows.stop - rows.start, FeatureRange.whole(1)
        else:
            group_size = self.group_size
            whole = FeatureRange.whole(-(-rows.total // group_size))
            groups = whole if rows.is_whole else rows.packed(group_size, f"{prefix}.weight_scale")
        if rows.total % PACK:
            raise WeightsError(
                f"{prefix}: {rows.total} input features are not a multiple of {PACK}"
            )
        # Stored transposed to our layout: outputs are rows, inputs columns.
        packed_name = f"{prefix}.weight_packed"
        packed = read_part(weights, packed_name, cols, rows.packed(PACK, packed_name))
        scales = read_part(weights, f"{prefix}.weight_scale", cols, groups)
        # Symmetric checkpoints may still carry (zero) zero points; read them when present.
        if self.zero_point or weights.has(f"{prefix}.weight_zero_point"):
            zp_name = f"{prefix}.weight_zero_point"  # packs 8 outputs a word
            packed_zeros = read_part(weights, zp_name, cols.packed(PACK, zp_name), groups)
            zeros = unpack_rows(packed_zeros)  # [out, groups], already + 8
        else:
            zeros = torch.full_like(scales, OFFSET, dtype=torch.uint8)
        return QuantizedWeight(
            qweight=_repack_transposed(packed),
            zeros=zeros.T.contiguous(),
            scales=scales.T.contiguous(),
            group_size=group_size,
        )


def _repack_transposed(packed: torch.Tensor) -> torch.Tensor:
    """int32 [out, in / 8] packed along the inputs -> our int32 [in / 8, out]: the words are
    the same, only their arrangement transposes (both pack 8 consecutive inputs in order)."""
    return packed.T.contiguous()
