"""FP8 weights on a GPU, per M, against the dense bf16 cuBLAS GEMM, on Llama-2-7B's layer
shapes (weights in 128 x 128 blocks, as Qwen's and DeepSeek's FP8 releases store them):
- triton: our W8A16 GEMM (`fp8_matmul`, the W4A16 kernel's FP8 variant), the weight one byte
  an element, scaled in registers;
- served: the layer the server builds on CUDA (shard/layers/quant/fp8_linear.py's TritonFp8),
  which dequantizes column slices for cuBLAS from DEQUANT_MIN_ROWS rows;
- scaled_mm: torch's FP8 tensor-core GEMM (`torch._scaled_mm`, sm_89+) on per-output-channel
  weight scales with x quantized per row, the quantization timed too: what a W8A8 path would
  give (it changes the numbers: activations rounded to FP8), for comparison only.

Each is timed replayed from a CUDA graph after its output is checked against the dense product.
Prints one row per (shape, M) with times in microseconds and the ratio dense / kernel (> 1:
faster than dense), then the mean ratio per M.

    python bench/fp8_kernels_gpu.py [--tokens 1,4,16,64,256,4096]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gemm_table import ratio_table  # noqa: E402
from bench.kernels_w4a16 import LLAMA2_7B  # noqa: E402

MAX_ERROR = 2e-2  # W8A16 against the dense bf16 weight it dequantizes to
MAX_ERROR_W8A8 = 6e-2  # FP8 activations add e4m3's rounding (2^-4 relative)
BLOCK = 128
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def random_fp8(k: int, n: int, device: torch.device, gen: torch.Generator):
    """An FP8 weight [N, K] with 128 x 128 block scales, as transformers' Fp8Quantize makes one
    from a normal weight; its internal form (shard.layers.quant.fp8.Fp8Weight)."""
    from shard.layers.quant.fp8 import Fp8Weight

    w = torch.randn(n, k, generator=gen) * 0.02
    blocks = w.reshape(n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)) / FP8_MAX  # [N / 128, K / 128]
    q = (blocks / scale[:, None, :, None]).reshape(n, k).to(torch.float8_e4m3fn)
    per_row = scale.repeat_interleave(BLOCK, dim=0)
    return Fp8Weight(q.to(device), per_row.to(device), BLOCK)


def kernels(fw) -> dict[str, Callable]:
    from shard.layers.quant.fp8_linear import TritonFp8
    from shard.platforms.cuda.kernels.w4a16 import fp8_matmul

    served = TritonFp8(fw)
    # W8A8 for comparison: per-channel weight scales (the max over a row's blocks) re-quantize
    # the weight once; x is quantized per row at every call.
    dense = fw.dequantize(torch.float32)
    w_scale = dense.abs().amax(dim=1, keepdim=True) / FP8_MAX
    w8 = (dense / w_scale).to(torch.float8_e4m3fn)

    def scaled_mm(x: torch.Tensor) -> torch.Tensor:
        x_scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
        x8 = (x / x_scale).to(torch.float8_e4m3fn)
        return torch._scaled_mm(
            x8, w8.T, scale_a=x_scale, scale_b=w_scale.T, out_dtype=torch.bfloat16
        )

    return {
        "triton": lambda x: fp8_matmul(x, fw.weight, fw.scales, fw.block_k),
        "served": served,
        "scaled_mm": scaled_mm,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1,4,16,64,256,4096")
    args = parser.parse_args()
    from triton.testing import do_bench_cudagraph

    device = torch.device("cuda")
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    tokens = [int(t) for t in args.tokens.split(",")]
    gen = torch.Generator().manual_seed(0)

    def build(k: int, n: int):
        fw = random_fp8(k, n, device, gen)
        return fw.dequantize(torch.bfloat16), kernels(fw)

    def max_error(name: str) -> float:
        return MAX_ERROR_W8A8 if name == "scaled_mm" else MAX_ERROR

    means = ratio_table(LLAMA2_7B, tokens, build, max_error, do_bench_cudagraph, device, gen)
    print("\nmean ratio dense/kernel over the four shapes, per M:")
    for m in tokens:
        print(f"  M={m:<5} " + "  ".join(f"{k} {v:.2f}x" for k, v in means[m].items()))


if __name__ == "__main__":
    main()
