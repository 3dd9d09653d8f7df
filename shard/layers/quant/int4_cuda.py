"""Int4 matmuls on CUDA: torch's tinygemm (`aten._weight_int4pack_mm`) for decode-sized row
counts, TritonInt4 (shard/layers/quant/int4_triton.py) beyond: the Triton W4A16 GEMM, and from
its DEQUANT_MIN_ROWS rows the weight dequantized once for cuBLAS.

Why per row count: on an H200, Llama-2-7B's layer shapes, each kernel replayed from a CUDA graph
(bench/int4_kernels_gpu.py, docs/benchmarks.md "Third GPU session"), tinygemm ran 1.86x dense
bf16 cuBLAS at 1 row and 1.29x at 4, but 0.47x at 16 and 0.04x at 256, where our Triton GEMM
runs 0.46x and 0.33x. So up to TINYGEMM_MAX_ROWS rows go to tinygemm.

tinygemm takes bf16 activations, bf16 scales and float zeros (shard/layers/quant/tinygemm.py),
so it runs for bf16 models only (`--dtype auto` picks bf16 for an int4 checkpoint on CUDA,
`CudaPlatform.int4_activation_dtype`); fp16 and fp32 ones run the Triton GEMM at every row
count rather than lose their precision to bf16 rounding. Its weight is
repacked once at load into its own tiled layout (`_convert_weight_to_int4pack`, two codes a
byte, even input rows in the high nibble, as checked on the device by the benchmark); the
Triton layout stays for larger row counts, so an int4 weight takes twice its packed bytes on
the device (still half of fp16's). Weights tinygemm cannot take (act-order, other group sizes,
shapes off its tiles) run the Triton GEMM at every row count.
"""

from __future__ import annotations

import torch

from shard.layers.quant import tinygemm
from shard.layers.quant.int4 import QuantizedWeight, unpack_rows
from shard.layers.quant.int4_triton import TritonInt4

# Rows from the measured table up to which tinygemm beats our Triton GEMM (and dense cuBLAS).
TINYGEMM_MAX_ROWS = 4
# tinygemm's tiling: inner K tiles of 16 input rows (8 of them per step), outputs in eights.
INNER_K_TILES = 8


def cuda_group_size(qw: QuantizedWeight) -> int | None:
    """The group size tinygemm on CUDA runs this weight with, or None."""
    size = tinygemm.group_size(qw)
    if size is None or qw.in_features % (INNER_K_TILES * 16) or qw.out_features % 8:
        return None
    return size


def pack_for_cuda(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] codes 0..15 -> the bytes `_convert_weight_to_int4pack` takes: [N, K / 2] uint8,
    input row 2i in the high nibble and 2i + 1 in the low one."""
    codes = codes.to(torch.uint8)
    return (codes[:, ::2] << 4) | codes[:, 1::2]


class CudaInt4(TritonInt4):
    """tinygemm for up to TINYGEMM_MAX_ROWS bf16 rows where the weight allows it, Triton
    otherwise."""

    def __init__(self, qw: QuantizedWeight) -> None:
        super().__init__(qw)
        self.tiny_group_size = cuda_group_size(qw)
        if self.tiny_group_size is None:
            return
        codes = unpack_rows(qw.qweight).T.contiguous()  # [N, K]
        packed = torch.ops.aten._convert_weight_to_int4pack(pack_for_cuda(codes), INNER_K_TILES)
        self.register_buffer("tiny_weight", packed)
        scale_zero = tinygemm.scale_zero(qw, self.tiny_group_size)
        self.register_buffer("tiny_scale_zero", scale_zero.to(torch.bfloat16).contiguous())

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if self.tiny_group_size is None or rows > TINYGEMM_MAX_ROWS or x.dtype != torch.bfloat16:
            return super().forward(x, bias)
        out = torch.ops.aten._weight_int4pack_mm(
            x.reshape(rows, x.shape[-1]), self.tiny_weight, self.tiny_group_size,
            self.tiny_scale_zero,
        )  # fmt: skip
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], self.out_features)
