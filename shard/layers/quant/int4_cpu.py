"""Int4 matmuls on the CPU: torch's own int4 kernel where it applies, else dequantizing.

torch's `_weight_int4pack_mm_for_cpu` reads the packed weight directly, which is what makes
int4 pay on a CPU: decode there is bound by the bytes of weight read per token. It is only fast
for bfloat16 activations (fp32 and fp16 take a reference path ~30x slower; bench/int4_cpu.py),
wants groups of 32-256 consecutive input rows, and computes (code - 8) * scale + zero per group
(shard/layers/quant/tinygemm.py). Each row of x is a separate pass
over the weight, so for many rows (long prefill chunks) dequantizing a slice of the weight at a
time and running a dense GEMM is faster; `DENSE_MIN_ROWS` is that crossover, measured.
"""

from __future__ import annotations

from functools import cache

import torch

from shard.layers.quant import tinygemm
from shard.layers.quant.int4 import QuantizedWeight, unpack_rows
from shard.layers.quant.int4_dequant import DEQUANT_CHUNK, DequantizingInt4

# Rows of x from which dequantize + GEMM beats the int4 kernel: 2048x8192, one thread, bf16:
# 54.6 vs 49.3 ms at 128 rows, 80.8 vs 99.2 ms at 256 (bench/int4_cpu.py).
DENSE_MIN_ROWS = 160
# torch's CPU int4 layout: blocks of B output rows, each byte holding rows j and j + B/2 of the
# block at one input position; B is 64 where torch was built for AVX-512 and the CPU has it, 32
# on AVX2 (seen on an EPYC without AVX-512). Probed once; checked against the real kernel at
# load too (see CpuInt4).
_CPU_BLOCK_SIZES = (64, 32)


@cache
def _cpu_block_n() -> int | None:
    """The block size of torch's CPU int4 packing on this machine, or None if it is neither."""
    codes = torch.arange(64 * 64, dtype=torch.int32).reshape(64, 64) % 16
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    for block in _CPU_BLOCK_SIZES:
        if torch.equal(_unpack_cpu_layout(packed, 64, block), codes.to(torch.uint8)):
            return block
    return None


def _unpack_cpu_layout(packed: torch.Tensor, k: int, block: int) -> torch.Tensor:
    """torch's CPU int4 layout [n, K / 2] uint8 -> [n, K] codes (n a multiple of `block`)."""
    n = packed.shape[0]
    blocks = packed.view(n // block, k, block // 2)
    both = torch.cat([blocks & 0xF, blocks >> 4], dim=-1)  # [n / 64, K, 64]
    return both.transpose(1, 2).reshape(n, k)


class CpuInt4(DequantizingInt4):
    """torch's CPU int4 kernel for up to DENSE_MIN_ROWS rows, dequantize + GEMM beyond.

    The dense path reads its codes back out of the kernel's own packed weight, so only one
    packed copy is kept; if this torch packs differently than `_unpack_cpu_layout` expects
    (checked once, here), the original packing is kept as well.
    """

    def __init__(self, qw: QuantizedWeight, group_size: int) -> None:
        super().__init__(qw)
        self.kernel_group_size = group_size
        scale_zero = tinygemm.scale_zero(qw, group_size)
        self.register_buffer("scale_zero", scale_zero.to(torch.bfloat16).contiguous())
        # DEQUANT_CHUNK rows packed at once (the layout is local to blocks of 64 or 32 rows,
        # so the pieces are the whole tensor's rows): the kernel's packer wants int32 codes,
        # 8x the packed bytes, and unpacking goes through int32 too. Whole-tensor temporaries
        # (~270 MB for a 2048x16384 gate_up) made the 1.1B Llama's load peak at 1.9 GB for
        # 0.77 GB of weights, and glibc kept ~600 MB of those freed blocks afterwards.
        n, k = self.out_features, self.in_features
        self.register_buffer("packed", torch.empty(n, k // 2, dtype=torch.uint8))
        self.block = _cpu_block_n()
        self.own_layout = self.block is not None and n % self.block == 0
        for start in range(0, n, DEQUANT_CHUNK):
            stop = min(start + DEQUANT_CHUNK, n)
            codes = unpack_rows(qw.qweight[:, start:stop]).T.contiguous()  # [c, K]
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 1)
            self.packed[start:stop] = packed
            self.own_layout = self.own_layout and torch.equal(
                _unpack_cpu_layout(packed, k, self.block),
                codes,  # type: ignore[arg-type]
            )
        if self.own_layout:
            self.qweight = None  # the kernel's copy serves the dense path too

    def codes(self, start: int, stop: int) -> torch.Tensor:
        if not self.own_layout:
            return super().codes(start, stop)
        return _unpack_cpu_layout(self.packed[start:stop], self.in_features, self.block)  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows >= DENSE_MIN_ROWS or x.dtype != torch.bfloat16:
            return super().forward(x, bias)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.reshape(rows, x.shape[-1]), self.packed, self.kernel_group_size, self.scale_zero
        )
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], self.out_features)
