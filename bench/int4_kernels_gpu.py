"""Which int4 GEMM to run per M on a GPU (issue 50, 1), against the dense bf16 cuBLAS GEMM, on
Llama-2-7B's layer shapes, M = 1 to 4096:
- tinygemm: torch's `aten._weight_int4pack_mm` (bf16, weights repacked once by
  `_convert_weight_to_int4pack`);
- triton: our W4A16 GEMM (shard/platforms/cuda/kernels/w4a16.py);
- dequant: the weight dequantized in one pass by our kernel (int4_dequant.dequantize_int4),
  then cuBLAS, both timed;
- gemlite (with --gemlite, where the package is installed): its A16W4 Triton kernels, which pick
  GEMV / split-K GEMM / GEMM by M and autotune on first use (so its step may take a while);
- served: the layer the server builds on CUDA (shard/layers/quant/int4_cuda.py's CudaInt4), which
  picks among the first three by M: the column that shows the dispatch is right.

Each is timed replayed from a CUDA graph (triton.testing.do_bench_cudagraph), so launch costs do
not hide the kernels at small M, after its output is checked against the dense product. Prints
one row per (shape, M) with each time in microseconds and the ratio dense / kernel (> 1: faster
than dense), then the mean ratio per M and kernel and the best one.

    python bench/int4_kernels_gpu.py [--tokens 1,4,16,64,256,4096] [--gemlite]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gemm_table import ratio_table  # noqa: E402
from bench.kernels_w4a16 import LLAMA2_7B, random_int4  # noqa: E402

# Relative error allowed against x @ the dense bf16 weight (bf16 outputs, fp32 sums).
MAX_ERROR = 2e-2


def gemlite_layer(qw, device: torch.device) -> torch.nn.Module:
    """gemlite's A16W4 layer holding the same weight: codes [N, K], per-group scales and zeros
    [N, G] with w = (code - zero) * scale, which is our layout's meaning."""
    from gemlite.core import DType, GemLiteLinearTriton

    layer = GemLiteLinearTriton(
        W_nbits=4, group_size=qw.group_size, in_features=qw.in_features,
        out_features=qw.out_features, input_dtype=DType.BF16, output_dtype=DType.BF16,
    )  # fmt: skip
    layer.pack(
        qw.codes().T.contiguous().to(device),
        qw.scales.T.contiguous().bfloat16(),
        qw.zeros.T.contiguous().bfloat16(),
        bias=None,
    )
    return layer


def kernels(qw, with_gemlite: bool, device: torch.device) -> dict[str, Callable]:
    """name -> a function of x [M, K] bf16 giving x @ W."""
    from shard.layers.quant.int4_cuda import CudaInt4
    from shard.platforms.cuda.kernels.w4a16 import w4a16_matmul

    served = CudaInt4(qw)  # holds tinygemm's repacked weight, and the dense path
    found = {
        "tinygemm": lambda x: torch.ops.aten._weight_int4pack_mm(
            x, served.tiny_weight, served.tiny_group_size, served.tiny_scale_zero
        ),
        "triton": lambda x: w4a16_matmul(x, qw.qweight, qw.scales, qw.zeros, None, qw.group_size),
        "dequant": lambda x: served.dense_matmul(x, None),
        "served": served,
    }
    if with_gemlite:
        found["gemlite"] = gemlite_layer(qw, device)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1,4,16,64,256,4096")
    parser.add_argument("--gemlite", action="store_true", help="also time gemlite's kernels")
    args = parser.parse_args()
    from triton.testing import do_bench_cudagraph

    device = torch.device("cuda")
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    if args.gemlite:
        import gemlite

        print("gemlite", getattr(gemlite, "__version__", "?"))
    tokens = [int(t) for t in args.tokens.split(",")]
    gen = torch.Generator().manual_seed(0)

    def build(k: int, n: int):
        qw, _ = random_int4(k, n, device, gen)  # group 128, fp16 scales
        return qw.dequantize(torch.bfloat16).T.contiguous(), kernels(qw, args.gemlite, device)

    means = ratio_table(
        LLAMA2_7B, tokens, build, lambda name: MAX_ERROR, do_bench_cudagraph, device, gen
    )
    print("\nmean ratio dense/kernel over the four shapes, per M (served: the server's choice):")
    for m in tokens:
        winner = max((n for n in means[m] if n != "served"), key=means[m].get)
        print(f"  M={m:<5} " + "  ".join(f"{k} {v:.2f}x" for k, v in means[m].items())
              + f"  -> best {winner}")  # fmt: skip


if __name__ == "__main__":
    main()
