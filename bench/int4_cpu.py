"""Where the CPU int4 paths cross over: torch's int4 kernel against dequantize + dense GEMM, and
both against the bf16 matmul, on one linear layer, for a range of rows (tokens in a step).

    .venv/bin/python -m bench.int4_cpu [--k 2048 --n 16384 --group 128 --threads 2]

Prints ms per call for each path and rows, and the ratios; `shard/layers/quant/int4_cpu.py`'s
DENSE_MIN_ROWS and the auto dtype rest on these numbers. The fp32/fp16 rows show why only bf16
activations get the kernel.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.nn.functional as F

from shard.layers.quant.int4 import QuantizedWeight, pack_rows
from shard.layers.quant.int4_cpu import CpuInt4
from shard.layers.quant.int4_dequant import DequantizingInt4

ROWS = (1, 4, 16, 64, 160, 256, 384, 512)


def timed(fn, repeat: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e3


def layer(k: int, n: int, group: int) -> QuantizedWeight:
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
    return QuantizedWeight(
        qweight=pack_rows(codes),
        zeros=torch.randint(0, 16, (k // group, n), generator=gen, dtype=torch.uint8),
        scales=(torch.rand(k // group, n, generator=gen) * 0.01).half(),
        group_size=group,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--n", type=int, default=16384)  # a 1B Llama's fused gate_up
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    qw = layer(args.k, args.n, args.group)
    kernel, dense = CpuInt4(qw, args.group), DequantizingInt4(qw)
    weight = dense(torch.eye(args.k)).T.to(torch.bfloat16).contiguous()  # [n, k]
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{args.threads} threads, layer {args.k}x{args.n}, group {args.group}")  # fmt: skip
    print(f"{'rows':>5} {'int4 kernel':>12} {'deq+GEMM':>9} {'bf16':>8} "
          f"{'deq/kernel':>11} {'bf16/kernel':>12}")  # fmt: skip
    packed, group, scale_zero = kernel.packed, kernel.kernel_group_size, kernel.scale_zero
    for rows in ROWS:
        x = torch.randn(rows, args.k).to(torch.bfloat16)
        a = timed(lambda x=x: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, packed, group, scale_zero), args.repeat)  # fmt: skip
        b = timed(lambda x=x: DequantizingInt4.forward(kernel, x), args.repeat)
        c = timed(lambda x=x: F.linear(x, weight), args.repeat)
        print(f"{rows:>5} {a:>10.2f}ms {b:>7.2f}ms {c:>6.2f}ms {b / a:>11.2f} {c / a:>12.2f}")
    x = torch.randn(1, args.k)
    for dtype in (torch.float32, torch.float16):
        sz = kernel.scale_zero.to(dtype)
        ms = timed(lambda dtype=dtype, sz=sz: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(dtype), kernel.packed, kernel.kernel_group_size, sz), 2)  # fmt: skip
        print(f"int4 kernel with {dtype} activations, 1 row: {ms:.2f} ms")


if __name__ == "__main__":
    main()
