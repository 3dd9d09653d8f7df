"""The GPU kernel benchmark's rows, device peaks, timer and table (bench/kernels.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Peak:
    bytes_per_s: float
    flops: float  # dense bf16/fp16 tensor-core FLOP/s


# Matched against torch.cuda.get_device_name(); H200 first ("H200" never contains "H100").
PEAKS = {"H200": Peak(4.8e12, 989e12), "H100": Peak(3.35e12, 989e12)}


@dataclass
class Result:
    name: str
    ms: float
    work: float  # bytes or FLOPs
    unit: str  # "TB/s" or "TFLOP/s"
    baseline_ms: float | None = None  # SDPA, or torch.matmul for the W4A16 GEMM
    note: str = ""
    max_err: float | None = None  # max |ours - baseline|: a compiled-mode bug shows here at once
    flops: float | None = None  # also reported as TFLOP/s when `work` is bytes


def device_peak() -> tuple[str, Peak | None]:
    if not torch.cuda.is_available():
        return "cpu (interpreter)", None
    name = torch.cuda.get_device_name()
    # H100 PCIe/NVL have other peaks; only the SXM numbers are known here.
    if "H100" in name and ("PCIe" in name or "NVL" in name):
        return name, None
    return name, next((p for key, p in PEAKS.items() if key in name), None)


def timer(smoke: bool) -> Callable[[Callable[[], object]], float]:
    if not smoke:
        import triton.testing

        # do_bench clears L2 before every run: weights and K/V are timed as read from HBM, as
        # they are in serving, where a layer's weights have left L2 by the next step.
        return lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    def wall_ms(fn: Callable[[], object]) -> float:
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    return wall_ms


def graph_note(ours: Callable[[], object], base: Callable[[], object]) -> str:
    """`ours` and `base` replayed from CUDA graphs, as a serving step captured in one would run
    them: small calls' eager times are mostly Python and launch overhead (a Triton launch costs
    more than a cuBLAS one), which a graph removes. Replays do not clear L2 between calls, so
    operands smaller than L2 (LoRA adapters) are read from it: their best case."""
    if not torch.cuda.is_available():
        return ""
    import triton.testing

    try:
        times = [triton.testing.do_bench_cudagraph(f, return_mode="median") for f in (ours, base)]
    except Exception as error:  # noqa: BLE001 (a note, not a crash of the whole section)
        return f"; CUDA graph failed: {type(error).__name__}"
    return f"; graphed {times[0]:.3f} vs {times[1]:.3f} ms ({times[0] / times[1]:.2f})"


def report(results: list[Result], device_name: str, peak: Peak | None) -> None:
    print(f"device: {device_name}; torch {torch.__version__}")
    if peak is None:
        print("peak: unknown for this device; no %-of-peak column")
    header = (
        f"{'kernel':52} {'ms':>9} {'achieved':>16} {'of peak':>8} {'TFLOP/s':>8} {'base ms':>9} "
        f"{'ratio':>6} {'max|diff|':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        rate = r.work / (r.ms * 1e-3)
        if r.unit == "TB/s":
            of_peak = peak and rate / peak.bytes_per_s
        else:
            of_peak = peak and rate / peak.flops
        peak_s = f"{of_peak:8.1%}" if of_peak else f"{'-':>8}"
        flops_s = f"{r.flops / (r.ms * 1e-3) / 1e12:8.2f}" if r.flops else f"{'':8}"
        base_s = (
            f"{r.baseline_ms:9.3f} {r.baseline_ms / r.ms:6.2f}"
            if r.baseline_ms
            else f"{'':9} {'':6}"
        )
        err_s = f"{r.max_err:9.2e}" if r.max_err is not None else f"{'':9}"
        line = (
            f"{r.name:52} {r.ms:9.3f} {rate / 1e12:9.2f} {r.unit:7}{peak_s} {flops_s} {base_s} "
            f"{err_s}"
        )
        print(f"{line} {r.note}".rstrip())
