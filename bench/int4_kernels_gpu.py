"""Which int4 GEMM to run per M on a GPU (issue 50, 1): torch's tinygemm
(`aten._weight_int4pack_mm`, bf16, weights repacked once by `_convert_weight_to_int4pack`) and our
Triton W4A16 against the dense cuBLAS GEMM, on Llama-2-7B's layer shapes, M = 1 to 4096.

Each kernel is timed replayed from a CUDA graph (triton.testing.do_bench_cudagraph), so launch
costs do not hide the kernels at small M; tinygemm's output is checked against its own
dequantization, (q - 8) * scale + zero per group of 128 along K, before it is timed. Prints one
row per (shape, M) with each time in microseconds and the ratio dense / kernel (> 1: faster than
dense), and the best int4 kernel per M.

    python bench/int4_kernels_gpu.py [--tokens 1,4,16,64,256,4096]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernels_w4a16 import LLAMA2_7B, random_int4  # noqa: E402

GROUP = 128
INNER_K_TILES = 8


def tinygemm_weight(k: int, n: int, gen: torch.Generator, device: torch.device):
    """Random int4 codes for W [N, K] with bf16 scales and float zeros per group, packed as
    tinygemm takes them, and the dense bf16 dequantization."""
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
    groups = k // GROUP
    scales = ((torch.rand(n, groups, generator=gen) + 0.5) / (6.5 * k**0.5)).bfloat16()
    zeros = (torch.randn(n, groups, generator=gen) * scales.float()).bfloat16()
    packed_bytes = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)
    packed = torch.ops.aten._convert_weight_to_int4pack(packed_bytes.to(device), INNER_K_TILES)
    scales_zeros = torch.stack([scales, zeros], dim=2).transpose(0, 1).contiguous().to(device)
    expand = lambda t: t.float().repeat_interleave(GROUP, dim=1)  # noqa: E731
    dense = ((codes.float() - 8) * expand(scales) + expand(zeros)).bfloat16().to(device)
    return packed, scales_zeros, dense


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1,4,16,64,256,4096")
    args = parser.parse_args()
    from triton.testing import do_bench_cudagraph

    from shard.platforms.cuda.kernels.w4a16 import w4a16_matmul

    device = torch.device("cuda")
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    tokens = [int(t) for t in args.tokens.split(",")]
    gen = torch.Generator().manual_seed(0)
    best: dict[int, list[tuple[str, float]]] = {m: [] for m in tokens}
    print(f"{'K x N':>13} {'M':>5} {'dense us':>9} {'tinygemm us':>12} {'x':>6} "
          f"{'triton us':>10} {'x':>6}")  # fmt: skip
    for k, n in LLAMA2_7B:
        packed, scales_zeros, dense_bf16 = tinygemm_weight(k, n, gen, device)
        qw, dense_fp16 = random_int4(k, n, device, gen)
        for m in tokens:
            x = torch.randn(m, k, generator=gen).bfloat16().to(device)
            x16 = x.half()

            def tiny(x=x, packed=packed, scales_zeros=scales_zeros):
                return torch.ops.aten._weight_int4pack_mm(x, packed, GROUP, scales_zeros)

            want = x.float() @ dense_bf16.float().T
            got = tiny().float()
            error = ((got - want).norm() / want.norm()).item()
            assert error < 2e-2, f"tinygemm K={k} N={n} M={m}: relative error {error:.3g}"
            times = {
                "dense": do_bench_cudagraph(lambda x=x, w=dense_bf16: x @ w.T),
                "tinygemm": do_bench_cudagraph(tiny),
                "triton": do_bench_cudagraph(
                    lambda x16=x16, qw=qw: w4a16_matmul(
                        x16, qw.qweight, qw.scales, qw.zeros, None, GROUP
                    )
                ),
            }
            d = times["dense"]
            print(
                f"{k:>6}x{n:<6} {m:>5} {d * 1e3:>9.1f} {times['tinygemm'] * 1e3:>12.1f} "
                f"{d / times['tinygemm']:>6.2f} {times['triton'] * 1e3:>10.1f} "
                f"{d / times['triton']:>6.2f}",
                flush=True,
            )
            for name in ("tinygemm", "triton"):
                best[m].append((name, d / times[name]))
    print("\nmean ratio dense/kernel over the four shapes, per M:")
    for m in tokens:
        by_kernel: dict[str, list[float]] = {}
        for name, ratio in best[m]:
            by_kernel.setdefault(name, []).append(ratio)
        means = {name: sum(r) / len(r) for name, r in by_kernel.items()}
        winner = max(means, key=means.get)
        print(f"  M={m:<5} " + "  ".join(f"{k} {v:.2f}x" for k, v in means.items())
              + f"  -> {winner}")  # fmt: skip


if __name__ == "__main__":
    main()
