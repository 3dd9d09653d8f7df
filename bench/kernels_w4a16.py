"""The W4A16 GEMM against torch.matmul with the dense fp16 weight (cuBLAS), on Llama-2-7B's layer
shapes, for bench/kernels.py.

Targets (docs/kernels.md): >= 3x torch's speed at M = 1 (decode reads a quarter of the weight
bytes) and >= 0.9x at M = 4096 (compute-bound, dequantizing must hide under the tensor cores).
Bandwidth counts what the kernel must read and write: int4 codes, fp16 scales and uint8 zeros,
x and the output.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bench.kernel_report import Result, graph_note

# Llama-2-7B's linears as (K, N): q/k/v/o 4096x4096, gate/up 4096x11008, down 11008x4096, and
# the fused qkv 4096x12288.
LLAMA2_7B = ((4096, 4096), (4096, 11008), (11008, 4096), (4096, 12288))
TOKENS = (1, 16, 256, 4096)
GROUP_SIZE = 128
# Tiny shapes for --smoke (the interpreter): K off the K tile, N off the N tile, both paths.
SMOKE_SHAPES = ((136, 40), (256, 24))
SMOKE_TOKENS = (1, 16, 37)


def random_int4(k: int, n: int, device: torch.device, gen: torch.Generator):
    """A QuantizedWeight with random codes, asymmetric zeros, fp16 scales sized for O(1)
    outputs, and its dense fp16 dequantization (torch.matmul's operand)."""
    from shard.layers.quant.int4 import QuantizedWeight, pack_rows

    groups = -(-k // GROUP_SIZE)
    codes = torch.randint(0, 16, (k, n), generator=gen)
    zeros = torch.randint(0, 16, (groups, n), generator=gen).to(torch.uint8)
    scales = ((torch.rand(groups, n, generator=gen) + 0.5) / (6.5 * k**0.5)).half()
    qw = QuantizedWeight(pack_rows(codes).to(device), zeros.to(device), scales.to(device), 128)
    return qw, qw.dequantize(torch.float16)


def bench_w4a16(
    bench: Callable[[Callable[[], object]], float], device: torch.device, smoke: bool, sweep: bool
) -> list[Result]:
    from shard.platforms.cuda.kernels.w4a16 import w4a16_matmul

    gen = torch.Generator().manual_seed(0)
    results = []
    for k, n in SMOKE_SHAPES if smoke else LLAMA2_7B:
        qw, dense = random_int4(k, n, device, gen)
        weight_bytes = sum(t.numel() * t.element_size() for t in (qw.qweight, qw.scales, qw.zeros))
        for m in SMOKE_TOKENS if smoke else TOKENS:
            x = torch.randn(m, k, generator=gen).half().to(device)

            def ours(config=None, x=x, qw=qw):
                return w4a16_matmul(x, qw.qweight, qw.scales, qw.zeros, None, 128, config=config)

            work = weight_bytes + 2 * m * (k + n)  # + fp16 x read and output written
            name = f"w4a16 M={m} K={k} N={n}"

            def torch_mm(x=x, d=dense):
                return x @ d

            row = Result(name, bench(ours), work, "TB/s", bench(torch_mm))
            row.flops = 2.0 * m * k * n
            row.max_err = (ours().float() - torch_mm().float()).abs().max().item()
            row.note = "vs torch.matmul fp16" + graph_note(ours, torch_mm)
            results.append(row)
            if sweep and (k, n) == (4096, 11008) and m in (1, 4096):
                results += sweep_w4a16(bench, lambda c, f=ours: f(c), m, work, 2.0 * m * k * n)
    return results


def sweep_w4a16(bench, ours, m: int, work: float, flops: float) -> list[Result]:
    from shard.platforms.cuda.kernels.w4a16_config import W4A16Config

    if m <= 16:
        candidates = [W4A16Config(16, 64, 128, 4, 4, split_k=s, scale_after_dot=True)
                      for s in (1, 2, 4, 8, 16)]  # fmt: skip
        candidates += [
            W4A16Config(16, 64, 128, 4, 4),  # scale on the weight instead
            W4A16Config(16, 128, 128, 4, 4, scale_after_dot=True),
            W4A16Config(16, 64, 64, 4, 4, scale_after_dot=True),
            W4A16Config(16, 64, 128, 4, 2, scale_after_dot=True),
            W4A16Config(16, 128, 128, 8, 4, scale_after_dot=True),
        ]
    else:
        candidates = [
            W4A16Config(128, 128, 64, 8, 3),
            W4A16Config(128, 128, 64, 8, 4),
            W4A16Config(256, 128, 64, 8, 2),
            W4A16Config(256, 128, 64, 8, 3),
            W4A16Config(128, 128, 128, 8, 3),
            W4A16Config(64, 128, 64, 4, 4),
        ]
    rows = []
    for cfg in candidates:
        label = (
            f"  sweep M={cfg.block_m} N={cfg.block_n} K={cfg.block_k} w={cfg.num_warps} "
            f"s={cfg.num_stages} split={cfg.split_k} after={int(cfg.scale_after_dot)}"
        )
        rows.append(Result(label, bench(lambda c=cfg: ours(c)), work, "TB/s", flops=flops))
    return rows
