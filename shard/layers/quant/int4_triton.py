"""Int4 weights on CUDA: the Triton W4A16 GEMM reads the packed layout directly
(shard/platforms/cuda/kernels/w4a16.py); from DEQUANT_MIN_ROWS rows the weight is instead
dequantized in one pass (int4_dequant.py's kernel) for a dense GEMM (cuBLAS on a GPU).

Why the switch: at many rows a GEMM is compute-bound, and a kernel that dequantizes every weight
tile for every tile of rows repeats that work M / BLOCK_M times, where cuBLAS on a dense weight
runs at the tensor cores' rate. On an H200 (docs/benchmarks.md, "Third GPU session", Llama-2-7B
shapes) our Triton GEMM ran 0.60x dense bf16 at 64 rows, 0.33x at 256 and 0.50x at 4096. The
dense weight costs one read of the packed one and one write of 2 bytes an element: about what
dense cuBLAS reads at a few rows, small beside the GEMM at a few hundred. The crossover is
measured per shape by bench/int4_kernels_gpu.py (its "dequant" column); DEQUANT_MIN_ROWS is the
estimate until a device run sets it.
"""

from __future__ import annotations

import torch

from shard.layers.quant.int4 import QuantizedWeight
from shard.layers.quant.int4_dequant import DequantizingInt4

# Rows of x from which the dense path runs (see above).
DEQUANT_MIN_ROWS = 256
# The most elements of dense weight made at once: larger weights go in column slices, so the
# temporary stays under 128 MiB in 16-bit dtypes (a 7B MLP weight is 45M elements, one slice).
DENSE_SLICE_ELEMENTS = 1 << 26


class TritonInt4(DequantizingInt4):
    """The Triton GEMM over the checkpoint's packed layout, kept as DequantizingInt4 keeps it;
    dequantize + dense GEMM from DEQUANT_MIN_ROWS rows."""

    def __init__(self, qw: QuantizedWeight) -> None:
        super().__init__(qw)
        # The kernels' act-order groups in int32, made once rather than at every call.
        self.register_buffer("g_idx32", None if qw.g_idx is None else qw.g_idx.int())

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        from shard.platforms.cuda.kernels.w4a16 import w4a16_matmul

        flat = x.reshape(-1, x.shape[-1])
        g_idx = self.g_idx32
        if flat.shape[0] >= DEQUANT_MIN_ROWS:
            out = self.dense_matmul(flat, g_idx)
        else:
            out = w4a16_matmul(flat, self.qweight, self.scales, self.zeros, g_idx, self.group_size)
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def dense_matmul(self, flat: torch.Tensor, g_idx: torch.Tensor | None) -> torch.Tensor:
        """flat [M, K] @ the weight dequantized to flat's dtype, a column slice at a time."""
        from shard.platforms.cuda.kernels.int4_dequant import dequantize_int4

        def dense(start: int, stop: int) -> torch.Tensor:
            return dequantize_int4(
                self.qweight[:, start:stop], self.scales[:, start:stop],
                self.zeros[:, start:stop], g_idx, self.group_size, flat.dtype,
            )  # fmt: skip

        n = self.out_features
        cols = max(128, DENSE_SLICE_ELEMENTS // max(1, self.in_features))
        if cols >= n:
            return flat @ dense(0, n)
        out = torch.empty(flat.shape[0], n, dtype=flat.dtype, device=flat.device)
        for start in range(0, n, cols):
            stop = min(start + cols, n)
            out[:, start:stop] = flat @ dense(start, stop)
        return out
