"""GPTQ checkpoints (AutoGPTQ / GPTQModel format), 4-bit.

    qweight int32 [in / 8, out]          8 codes per int32 along the input features, in order
    qzeros  int32 [groups, out / 8]      8 zero points per int32 along the output features
    scales  fp16  [groups, out]
    g_idx   int32 [in]                   group of each input row; with act-order (desc_act)
                                         the rows of a group are scattered
    weight[k, n] = (code[k, n] - zero[g_idx[k], n]) * scale[g_idx[k], n]

checkpoint_format "gptq" (v1) stores every zero point minus one, "gptq_v2" stores it as is.
"""

from __future__ import annotations

import torch

from shard.layers.quant.int4 import QuantizedWeight, unpack_rows
from shard.layers.quant.reader import FeatureRange, read_part, read_vector
from shard.weights import Weights

PACK = 8
V1_ZERO_OFFSET = 0x11111111  # 1 in each of the 8 nibbles of a word


class GptqReader:
    tensors = ("qweight", "qzeros", "scales", "g_idx")

    def __init__(self, group_size: int, desc_act: bool, v1_zeros: bool) -> None:
        self.group_size = group_size
        self.desc_act = desc_act
        self.v1_zeros = v1_zeros

    def out_features(self, weights: Weights, prefix: str) -> int:
        return weights.shape(f"{prefix}.qweight")[1]

    def in_features(self, weights: Weights, prefix: str) -> int:
        return weights.shape(f"{prefix}.qweight")[0] * PACK

    def groups(self, in_features: int) -> int:
        g = self.group_size if self.group_size != -1 else in_features
        return -(-in_features // g)

    def read(
        self, weights: Weights, prefix: str, rows: FeatureRange, cols: FeatureRange
    ) -> QuantizedWeight:
        channel = self.group_size == -1  # one group: its scales hold for any rows we take
        group_size = rows.total if channel else self.group_size
        num_groups = self.groups(rows.total)
        qweight_name, qzeros_name = f"{prefix}.qweight", f"{prefix}.qzeros"
        qweight = read_part(weights, qweight_name, rows.packed(PACK, qweight_name), cols)
        g_idx = self._g_idx(weights, prefix, rows)
        if channel:
            g_idx, group_size = None, rows.stop - rows.start
            group_rows = FeatureRange.whole(num_groups)
        elif g_idx is None or _is_sequential(g_idx, rows.start, group_size):
            g_idx = None
            whole = FeatureRange.whole(num_groups)
            group_rows = whole if rows.is_whole else rows.packed(group_size, qzeros_name)
        else:  # act-order: this slice's rows may belong to any group, so keep all of them
            group_rows = FeatureRange.whole(num_groups)
        # qweight packs the inputs, but qzeros packs 8 outputs a word: column pieces (fused q/k/v,
        # gate/up, a shard's outputs) must be whole words of it.
        packed_zeros = read_part(weights, qzeros_name, group_rows, cols.packed(PACK, qzeros_name))
        scales = read_part(weights, f"{prefix}.scales", group_rows, cols)
        if self.v1_zeros:
            # v1 subtracted 1 from every zero point as one word-wide subtraction (GPTQModel's
            # v2-to-v1 conversion), borrows included; the word-wide addition undoes it exactly.
            packed_zeros = packed_zeros + V1_ZERO_OFFSET
        zeros = unpack_rows(packed_zeros.T.contiguous()).T
        return QuantizedWeight(
            qweight=qweight,
            zeros=zeros.contiguous(),
            scales=scales,
            group_size=group_size,
            g_idx=g_idx,
        )

    def _g_idx(self, weights: Weights, prefix: str, rows: FeatureRange) -> torch.Tensor | None:
        name = f"{prefix}.g_idx"
        if not weights.has(name):
            if self.desc_act:
                weights.shape(name)  # act-order cannot work without it: fail naming it
            return None
        return read_vector(weights, name, rows).to(torch.int32)


def _is_sequential(g_idx: torch.Tensor, first_row: int, group_size: int) -> bool:
    rows = torch.arange(first_row, first_row + g_idx.numel(), device=g_idx.device)
    return bool(torch.equal(g_idx.long(), rows // group_size))
