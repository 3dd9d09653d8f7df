"""What LoRA adds to a shard's decode step on CPU, in process: step time by adapters per batch,
and the time spent inside the LoRA terms (shard/layers/lora.py LoraTerm.forward).

    .venv/bin/python -m bench.profile_lora [--batch 16] [--slots 0 1 4] [--steps 16] [--profile 4]
    .venv/bin/python -m bench.profile_lora --prefill --batch 15 --slots 0 15   # the prefill step

Builds the shard as `python -m shard serve` does (build_service) with --adapters PEFT adapters
(bench/lora_adapters.py), prefills one batch of --batch requests whose rows are spread
round-robin over the first N slots (0: base model), then times --steps Decode steps (with
--prefill: the prefill step itself, --steps times, each on a fresh batch: a wave of prompts over
that many adapters). The LoRA share is measured by wrapping LoraTerm.forward with a clock (no
profiler overhead); --profile N also prints torch.profiler's top operators for the N-slot case.
Cases alternate over --rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from bench.inprocess import build_shard, model_dir_or_default
from bench.lora_adapters import build_adapters, default_root
from bench.servers import free_port
from bench.shard_batches import cache_tokens_needed, make_batch


class _Clock:
    """Seconds spent inside the wrapped function since the last reset."""

    def __init__(self) -> None:
        self.total = 0.0
        self.calls = 0

    def wrap(self, fn):  # type: ignore[no-untyped-def]
        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - t0
                self.calls += 1

        return timed


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--adapters", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--max-lora-rank", type=int, default=64, help="the launcher's default")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--slots", type=int, nargs="+", default=[0, 1, 4])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--profile", type=int, default=None, help="torch.profiler for this case")
    p.add_argument("--compile", action="store_true", help="the shard's --compile forward")
    p.add_argument("--prefill", action="store_true", help="time the prefill step, not decode")
    args = p.parse_args(argv)
    os.environ.setdefault("MASTER_PORT", str(free_port()))

    import torch
    from torch.profiler import ProfilerActivity, profile

    from shard import wire
    from shard.layers.lora import LoraTerm

    args.model_dir = model_dir_or_default(args.model_dir)
    adapters = build_adapters(
        args.model_dir, default_root(args.model_dir, args.rank), max(args.adapters, 16), args.rank
    )
    names = list(adapters)[: args.adapters]
    service = build_shard(
        args.model_dir,
        args.dtype,
        lora_adapters=tuple((n, str(adapters[n])) for n in names),
        max_loras=args.adapters,
        max_lora_rank=args.max_lora_rank,
        compile=args.compile,
    )
    runner, lora = service.runner, service.lora
    assert lora is not None
    clock = _Clock()
    block = runner.block_size
    new_tokens = 2 * args.steps + 2
    runner.allocate_kv_cache(
        cache_tokens_needed(args.batch, args.seq_len, new_tokens, block) // block
    )

    def fresh_batch(n_slots: int):  # -> shard Batch, its rows round-robin over n_slots
        batch = wire.new_batch(pb_batch, runner.device)[0]
        ids = [names[i % n_slots] if n_slots else "" for i in range(args.batch)]
        batch.lora_slots = lora.assign(ids, []).slots.to(batch.lora_slots.device)
        return batch

    pb_batch = make_batch(1, args.batch, args.seq_len, new_tokens, block, runner.model.vocab_size)

    def run(n_slots: int, prof: bool = False) -> tuple[float, float]:
        """Median decode (or prefill) step and LoRA-term time per step (seconds)."""
        batch = fresh_batch(n_slots)
        runner.step(batch)  # prefill
        runner.step(batch)  # first decode: warm
        steps, lora_s = [], []
        ctx = profile(activities=[ProfilerActivity.CPU]) if prof else None
        if ctx:
            ctx.__enter__()
        for _ in range(args.steps):
            if args.prefill:
                batch = fresh_batch(n_slots)  # the same blocks again: rewritten, not read
            clock.total = 0.0
            t0 = time.perf_counter()
            runner.step(batch)
            steps.append(time.perf_counter() - t0)
            lora_s.append(clock.total)
        if ctx:
            ctx.__exit__(None, None, None)
            print(f"\ntorch.profiler, {n_slots} slot(s), {args.steps} steps:")
            print(ctx.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
        return statistics.median(steps), statistics.median(lora_s)

    if args.compile:
        # Compiled first: dynamo must not trace the clock. The graph calls the terms through
        # an opaque op (shard/platforms/cpu/compiled.py), which then finds the clocked forward.
        run(0)
    LoraTerm.forward = clock.wrap(LoraTerm.forward)  # type: ignore[method-assign]
    print(
        f"{'prefill' if args.prefill else 'decode'}, compiled {args.compile}, "
        f"threads {torch.get_num_threads()}, batch {args.batch}, context {args.seq_len}+, "
        f"rank {args.rank} padded to {args.max_lora_rank}, {len(names)} adapters loaded"
    )
    results: dict[int, list[tuple[float, float]]] = {n: [] for n in args.slots}
    for r in range(args.rounds):
        for n in args.slots if r % 2 == 0 else list(reversed(args.slots)):
            results[n].append(run(n))
    base = statistics.median(s for s, _ in results.get(0, [(float("nan"), 0.0)]))
    print(f"{'slots':>5} {'step ms (rounds)':>24} {'LoRA terms ms':>14} {'vs base':>8}")
    for n, rows in results.items():
        step = statistics.median(s for s, _ in rows)
        rounds = " / ".join(f"{s * 1e3:.1f}" for s, _ in rows)
        lora_ms = statistics.median(t for _, t in rows) * 1e3
        print(f"{n:>5} {rounds:>24} {lora_ms:14.1f} {step / base:7.2f}x")
    if args.profile is not None:
        run(args.profile, prof=True)


if __name__ == "__main__":
    main()
