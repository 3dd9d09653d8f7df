"""What torch's int4 kernels (tinygemm: `_weight_int4pack_mm` on CUDA, `_weight_int4pack_mm_for_cpu`
on the CPU) take, whatever the checkpoint's format: groups of 32-256 consecutive input rows, and
per group a scale and a float zero with w = (code - 8) * scale + zero. Our integer zero point z
folds in as zero = (8 - z) * scale; a per-channel weight runs as groups that repeat its scale.
"""

from __future__ import annotations

import torch

from shard.layers.quant.int4 import QuantizedWeight

GROUP_SIZES = (256, 128, 64, 32)


def group_size(qw: QuantizedWeight) -> int | None:
    """The group size the kernels can run this weight with, or None (act-order's g_idx
    scatters a group's rows; other sizes, or outputs not a multiple of 16)."""
    k = qw.in_features
    if qw.bits != 4 or qw.g_idx is not None or qw.out_features % 16:
        return None
    if qw.group_size in GROUP_SIZES and k % qw.group_size == 0:
        return qw.group_size
    if qw.group_size >= k:
        return next((g for g in GROUP_SIZES if k % g == 0), None)
    return None


def scale_zero(qw: QuantizedWeight, kernel_group_size: int) -> torch.Tensor:
    """[K / kernel_group_size, N, 2] float32: each group's scale and float zero."""
    repeat = qw.group_size // kernel_group_size if qw.group_size >= qw.in_features else 1
    scales = qw.scales.float().repeat_interleave(repeat, dim=0)
    zeros = qw.zeros.float().repeat_interleave(repeat, dim=0)
    return torch.stack([scales, (8 - zeros) * scales], dim=-1)
