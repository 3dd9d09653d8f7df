"""The table both GPU GEMM benchmarks print (bench/int4_kernels_gpu.py, fp8_kernels_gpu.py): per
layer shape and M, the dense bf16 GEMM's time and each kernel's, with the ratio dense / kernel,
each kernel's output checked against the dense product first."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

Kernels = dict[str, Callable[[torch.Tensor], torch.Tensor]]


def ratio_table(
    shapes: Iterable[tuple[int, int]],
    tokens: list[int],
    build: Callable[[int, int], tuple[torch.Tensor, Kernels]],
    max_error: Callable[[str], float],
    timer: Callable[[Callable[[], object]], float],
    device: torch.device,
    gen: torch.Generator,
) -> dict[int, dict[str, float]]:
    """`build(k, n)`: (the dense bf16 weight [N, K], name -> x [M, K] -> x @ W.T); `timer(fn)`:
    milliseconds per call. Prints a row per (shape, M); returns the mean ratio per M and name."""
    ratios: dict[int, dict[str, list[float]]] = {m: {} for m in tokens}
    header_done = False
    for k, n in shapes:
        dense, found = build(k, n)
        if not header_done:
            print(f"{'K x N':>13} {'M':>5} {'dense us':>9} "
                  + " ".join(f"{name + ' us':>12} {'x':>5}" for name in found))  # fmt: skip
            header_done = True
        for m in tokens:
            x = torch.randn(m, k, generator=gen).bfloat16().to(device)
            want = x.float() @ dense.float().T
            for name, fn in found.items():
                error = ((fn(x).float() - want).norm() / want.norm()).item()
                bound = max_error(name)
                assert error < bound, f"{name} K={k} N={n} M={m}: relative error {error:.3g}"
            d = timer(lambda x=x, w=dense: x @ w.T)
            row = f"{k:>6}x{n:<6} {m:>5} {d * 1e3:>9.1f}"
            for name, fn in found.items():
                t = timer(lambda x=x, fn=fn: fn(x))
                ratios[m].setdefault(name, []).append(d / t)
                row += f" {t * 1e3:>12.1f} {d / t:>5.2f}"
            print(row, flush=True)
    return {m: {name: sum(r) / len(r) for name, r in per.items()} for m, per in ratios.items()}
