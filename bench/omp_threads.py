"""Decode step time by which OS thread runs torch: the shard's runner, in process, no gRPC.

    .venv/bin/python -m bench.omp_threads [--batch 1] [--seq-len 128] [--steps 20]

torch's CPU ops parallelize with OpenMP (libgomp), which keeps one worker pool per OS thread
that enters a parallel region. The shard loads its model on the main thread and runs every step
in `asyncio.to_thread`, so two pools exist; on a machine with as many cores as torch threads
that slows the many small parallel regions of a step. Modes, each in a fresh process:
  same-thread     load, prefill and decode on the main thread
  to-thread       load on the main thread, decode through asyncio.to_thread (the shard today)
  one-worker      load, prefill and decode all on one non-main thread
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.inprocess import build_shard, prefilled_batch
from bench.servers import free_port

MODES = ("same-thread", "to-thread", "one-worker")


def build(model_dir: Path, batch: int, seq_len: int, steps: int):
    """A runner with one prefilled batch, ready for `steps` decodes."""
    runner = build_shard(model_dir, "bfloat16").runner
    state = prefilled_batch(runner, batch, seq_len, steps + 1)
    return runner, state


def timed_decode(runner, state) -> float:
    t0 = time.perf_counter()
    runner.step(state)
    return time.perf_counter() - t0


def measure(mode: str, args: argparse.Namespace) -> list[float]:
    if mode == "one-worker":
        out: list[float] = []

        def work() -> None:
            runner, state = build(args.model_dir, args.batch, args.seq_len, args.steps)
            out.extend(timed_decode(runner, state) for _ in range(args.steps))

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        return out
    runner, state = build(args.model_dir, args.batch, args.seq_len, args.steps)
    if mode == "same-thread":
        return [timed_decode(runner, state) for _ in range(args.steps)]

    async def via_to_thread() -> list[float]:
        return [await asyncio.to_thread(timed_decode, runner, state) for _ in range(args.steps)]

    return asyncio.run(via_to_thread())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--mode", choices=MODES, default=None, help="one mode in this process")
    args = p.parse_args(argv)
    if args.model_dir is None:
        from bench.build_smollm_shape import build as build_model
        from bench.build_smollm_shape import default_dir

        args.model_dir = build_model(default_dir())
    if args.mode:
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        times = measure(args.mode, args)
        print(f"{args.mode:12} batch {args.batch}: decode step median "
              f"{1e3 * statistics.median(times):.1f} ms", flush=True)  # fmt: skip
        return
    # Each mode in a fresh interpreter: OpenMP pools, once created, stay for the process.
    for mode in MODES:
        cmd = [sys.executable, "-m", "bench.omp_threads", "--mode", mode, "--model-dir",
               str(args.model_dir), "--batch", str(args.batch), "--seq-len", str(args.seq_len),
               "--steps", str(args.steps)]  # fmt: skip
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
