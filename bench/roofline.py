"""The CPU roofline of one decode step, measured on this machine, and where the shard stands.

    .venv/bin/python -m bench.roofline [--batch 16] [--seq-len 128] [--out bench/results/roofline]

Two floors for a decode step of `--batch` rows at context `--seq-len`:
- memory: every weight and every row's K/V read once, at the read bandwidth measured here
  (a large tensor summed with the threads torch uses, best of several passes);
- compute: each linear layer's FLOPs at the step's shape divided by the GEMM throughput
  measured at that very shape ([batch, in] x [in, out], the model's dtype, same threads), plus
  attention's FLOPs at the best measured throughput.
The roofline is the larger of the two; the shard's step (built as `python -m shard serve` does,
timed in process like bench/profile_decode.py) is reported against it. Run it on a quiet
machine: every figure is a rate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter
from pathlib import Path

from bench.inprocess import build_shard, model_dir_or_default, prefilled_batch
from bench.results_file import write_results
from bench.servers import free_port


def best_seconds(fn, repeats: int, inner: int = 1) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm: allocation, kernel selection
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return min(times)


def read_bandwidth(torch, gib: float, repeats: int) -> float:  # type: ignore[no-untyped-def]
    """Bytes per second of a reduction over a tensor far larger than the caches."""
    x = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    return x.numel() * 4 / best_seconds(lambda: x.sum(), repeats)


def gemm_rate(torch, m: int, k: int, n: int, dtype, repeats: int) -> float:  # type: ignore[no-untyped-def]
    """FLOP/s of the shard's own matmul at [m, k] x [k, n], its weight [n, k] in the layout the
    shard gives it (packed where it packs), the same weight every call: cache-hot, the best case."""
    from shard.platforms.cpu.matmul import linear, prepare_weight

    x = torch.randn(m, k).to(dtype)
    w = prepare_weight(torch.randn(n, k).to(dtype))
    seconds = best_seconds(lambda: linear(x, w), repeats, inner=10)
    return 2 * m * k * n / seconds


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=None, help="default: the SmolLM2 shape")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--bandwidth-gib", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=Path("bench/results/roofline"))
    p.add_argument("--compile", action="store_true", help="the shard's --compile path")
    args = p.parse_args(argv)
    os.environ.setdefault("MASTER_PORT", str(free_port()))

    import torch

    from shard.layers.embedding import VocabParallelEmbedding
    from shard.layers.quant.base import LinearWeight

    args.model_dir = model_dir_or_default(args.model_dir)
    runner = build_shard(args.model_dir, args.dtype, compile=args.compile).runner
    model = runner.model
    dtype = next(model.parameters()).dtype
    threads = torch.get_num_threads()

    # What one step reads and computes: every weight but the embedding table, of which a step
    # reads one row per token (a tied LM head multiplies with its own copy, counted).
    table = {id(m.weight) for m in model.modules() if isinstance(m, VocabParallelEmbedding)}
    weight_bytes = sum(
        t.numel() * t.element_size() for t in model.parameters() if id(t) not in table
    )
    # Every linear's [in, out] (LoRA terms aside), and the LM head's GEMM, tied or not.
    linears = Counter(
        (m.in_features, m.out_features) for m in model.modules() if isinstance(m, LinearWeight)
    )
    vocab, hidden = model.vocab_size, model.config.hidden_size
    linears[(hidden, vocab)] += 1
    cfg = model.config
    head_dim = cfg.head_dim
    context = args.seq_len + args.steps
    kv_bytes = (
        2 * cfg.num_layers * cfg.num_kv_heads * head_dim * context * args.batch
        * torch.empty(0, dtype=dtype).element_size()
    )  # fmt: skip
    attention_flops = 4 * cfg.num_layers * cfg.num_heads * head_dim * context
    attention_flops *= args.batch

    bandwidth = read_bandwidth(torch, args.bandwidth_gib, args.repeats)
    rates = {shape: gemm_rate(torch, args.batch, *shape, dtype, args.repeats) for shape in linears}
    peak = gemm_rate(torch, 1024, hidden, 4 * hidden, dtype, 3)
    linear_s = sum(n * 2 * args.batch * k * o / rates[(k, o)] for (k, o), n in linears.items())
    compute_s = linear_s + attention_flops / peak
    memory_s = (weight_bytes + kv_bytes) / bandwidth
    roofline_s = max(compute_s, memory_s)

    # The shard's own decode step.
    batch = prefilled_batch(runner, args.batch, args.seq_len, 2 * args.steps + 1)
    runner.step(batch)  # warm
    steps = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        runner.step(batch)
        steps.append(time.perf_counter() - t0)
    step_s = statistics.median(steps)

    result = {
        "model": str(args.model_dir),
        "dtype": str(dtype),
        "threads": threads,
        "batch": args.batch,
        "context": context,
        "weight_bytes": weight_bytes,
        "kv_bytes": kv_bytes,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "gemm_gflop_s_at_step_shapes": {f"{k}x{o}": rates[(k, o)] / 1e9 for k, o in rates},
        "gemm_gflop_s_peak_1024_rows": peak / 1e9,
        "memory_floor_ms": memory_s * 1e3,
        "compute_floor_ms": compute_s * 1e3,
        "roofline_ms": roofline_s * 1e3,
        "measured_step_ms": step_s * 1e3,
        "measured_over_roofline": step_s / roofline_s,
        "command_line": "python -m bench.roofline " + " ".join(argv or []),
        "torch": torch.__version__,
        "compile": args.compile,
    }
    print(f"threads {threads}, {dtype}, batch {args.batch}, context {context}")
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s; GEMM peak {peak / 1e9:.0f} GFLOP/s")
    for (k, o), n in sorted(linears.items()):
        rate = rates[(k, o)] / 1e9
        print(f"  linear {k:>5} x {o:>6} (x{n:>3}): {rate:6.1f} GFLOP/s at M={args.batch}")
    print(f"weights {weight_bytes / 2**20:.0f} MiB + KV {kv_bytes / 2**20:.1f} MiB: memory floor "
          f"{memory_s * 1e3:.1f} ms; compute floor {compute_s * 1e3:.1f} ms")  # fmt: skip
    print(f"roofline {roofline_s * 1e3:.1f} ms; measured step {step_s * 1e3:.1f} ms "
          f"= {step_s / roofline_s:.2f}x the roofline")  # fmt: skip
    path = write_results(args.out, "roofline", result)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
