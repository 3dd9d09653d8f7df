"""Where a shard's decode step goes: torch.profiler over the shard's own runner, in process.

    .venv/bin/python -m bench.profile_decode [--batch 16] [--seq-len 128] [--steps 8]

Builds the shard exactly as `python -m shard serve` does (shard.startup.build_service, world
size 1), prefills one batch, then profiles `--steps` Decode steps of the servicer's path
(Batch concat is skipped: one batch). Prints the top operators by self CPU time, grouped
into matmuls / attention / sampling / other, and the share of the step that no torch operator
accounts for (Python and dispatcher overhead). No gRPC: see bench/shard.py for the RPC cost.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from pathlib import Path

from bench.inprocess import build_shard, model_dir_or_default, prefilled_batch
from bench.servers import free_port

# Operator name fragments -> bucket; first match wins. Names are aten ops (CPU).
BUCKETS = [
    ("matmul (linear/mm)", "mm addmm linear matmul bmm mkldnn::_linear_pointwise"),
    ("attention (sdpa)", "scaled_dot_product softmax baddbmm"),
    ("sampling (topk/sort/argmax)", "topk sort argmax max log_softmax cumsum"),
    # The torch backend's decode gathers every row's K/V through the block table and masks it.
    (
        "gather/mask/copy",
        "copy_ index gather scatter cat to _to_copy clone masked_fill masked_fill_",
    ),
    ("elementwise", "mul add silu rsqrt pow mean neg sub div where exp sin cos"),
]


def bucket(name: str) -> str:
    op = name.removeprefix("aten::").split(".")[0]
    for label, keys in BUCKETS:
        if op in keys.split() or (label.startswith("attention") and "scaled_dot_product" in op):
            return label
    return "other ops"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--trace", type=Path, default=None, help="also write a Chrome trace here")
    p.add_argument("--compile", action="store_true", help="the shard's --compile path")
    args = p.parse_args(argv)
    os.environ.setdefault("MASTER_PORT", str(free_port()))

    import torch
    from torch.profiler import ProfilerActivity, profile

    args.model_dir = model_dir_or_default(args.model_dir)
    runner = build_shard(args.model_dir, args.dtype, compile=args.compile).runner
    batch = prefilled_batch(runner, args.batch, args.seq_len, 2 * args.steps + 1)
    for _ in range(args.steps):  # warm: first calls allocate and pick kernels
        runner.step(batch)
    wall = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            runner.step(batch)
            wall.append(time.perf_counter() - t0)
    step_ms = 1e3 * sum(wall) / len(wall)
    print(f"threads {torch.get_num_threads()}, batch {args.batch}, context {args.seq_len}+, "
          f"decode step {step_ms:.1f} ms (profiled, mean of {args.steps})")  # fmt: skip
    events = prof.key_averages()
    # Nested calls included (an aten::linear counts with its aten::mm): comparable across models
    # profiled the same way, e.g. transformers' eager forward.
    print(f"aten calls per step: {sum(e.count for e in events) / args.steps:.0f}")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))
    totals: dict[str, float] = defaultdict(float)
    for e in events:
        totals[bucket(e.key)] += e.self_cpu_time_total
    op_us = sum(totals.values())
    wall_us = 1e6 * sum(wall)
    print(f"{'bucket':32} {'ms/step':>8} {'share':>6}")
    for label, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{label:32} {us / 1e3 / args.steps:8.2f} {100 * us / wall_us:5.1f}%")
    # Self times of ops on one thread cannot exceed the wall time; what is left is Python,
    # dispatch and profiler bookkeeping between ops.
    print(f"{'outside ops (python/dispatch)':32} {(wall_us - op_us) / 1e3 / args.steps:8.2f} "
          f"{100 * (wall_us - op_us) / wall_us:5.1f}%")  # fmt: skip
    # Which weights the matmul time goes to, by input shapes (packed weights show as [out, in]).
    print("\nmatmuls by shape (ms/step):")
    mms = [
        e
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key in ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise")
    ]
    for e in sorted(mms, key=lambda e: -e.self_cpu_time_total)[:8]:
        per_step = e.self_cpu_time_total / 1e3 / args.steps
        print(f"  {per_step:8.2f}  x{e.count // args.steps:<4} {e.input_shapes}")
    if args.trace:
        prof.export_chrome_trace(str(args.trace))


if __name__ == "__main__":
    main()
