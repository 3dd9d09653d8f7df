"""Int4 weights on CUDA: the Triton W4A16 GEMM reads the packed layout directly
(shard/platforms/cuda/kernels/w4a16.py)."""

from __future__ import annotations

import torch

from shard.layers.quant.int4_dequant import DequantizingInt4


class TritonInt4(DequantizingInt4):
    """The Triton GEMM over the checkpoint's packed layout, kept as DequantizingInt4 keeps it."""

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        from shard.platforms.cuda.kernels.w4a16 import w4a16_matmul

        flat = x.reshape(-1, x.shape[-1])
        g_idx = None if self.g_idx is None else self.g_idx.int()
        out = w4a16_matmul(flat, self.qweight, self.scales, self.zeros, g_idx, self.group_size)
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], self.out_features)
