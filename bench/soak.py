"""Soak (issue 47, 5): many mixed requests against one launcher, then pass/fail per criterion.

    .venv/bin/python -m bench.soak                      # 10,000 requests, the demo model
    .venv/bin/python -m bench.soak --requests 300 --model-dir DIR

One server (bench.servers.switchyard: the launcher, bf16) serves the model and one PEFT LoRA
adapter of it (bench/lora_adapters.py). --warmup requests, then --requests more, run back to
back at --concurrency in flight, drawn by bench/soak_requests.py (six routes, sampling, stop
sequences, grammars, n > 1, the adapter, 30% of streams dropped mid-way; the last --window
requests replay the first --window after the warm-up); the router's and the shards' RSS is
sampled all along (bench/soak_rss.py). Then the overload phase: 4x
--max-concurrent-requests clients at once. The criteria are bench/soak_checks.py's; a summary
is printed and everything lands in <out>/soak-<time>.json. Exit status 1 when one fails.

--max-concurrent-requests defaults to 4x --concurrency: requests with n choices hold n permits,
and a dropped stream holds its own until the server notices the client has gone, so the main
phase must stay clear of the limit (a 429 there is an error); the overload phase then runs at
4x that limit.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shlex
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.lora_adapters import build_adapters, default_root
from bench.models import add_model_args, resolve_model
from bench.results_file import write_results
from bench.servers import ManagedServer, switchyard
from bench.soak_checks import (
    Verdict,
    errors_verdict,
    idle_verdict,
    latency_verdict,
    overload_verdict,
    rss_verdict,
    wait_idle,
)
from bench.soak_client import Outcome, run_all
from bench.soak_requests import Mix, make_requests, replay_window
from bench.soak_rss import RssSample, sample_every, server_processes

OVERLOAD_FACTOR = 4


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--requests", type=int, default=10_000, help="measured, after the warm-up")
    p.add_argument("--warmup", type=int, default=500, help="requests before the measured ones")
    p.add_argument("--window", type=int, default=1000, help="first/last requests compared")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-concurrent-requests", type=int, default=None, help="4x --concurrency")
    p.add_argument("--overload-requests", type=int, default=None, help="2 per overload client")
    p.add_argument("--drop", type=float, default=0.3, help="share of streams dropped")
    p.add_argument("--max-tokens", type=int, default=10, help="longest generation asked")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--adapter-dir", type=Path, default=None, help="where the adapter is built")
    p.add_argument("--rss-interval", type=float, default=2.0, help="seconds between samples")
    p.add_argument("--idle-timeout", type=float, default=60.0)
    p.add_argument("--switchyard-args", default="", help="extra launcher flags (one string)")
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)
    args.max_concurrent_requests = args.max_concurrent_requests or 4 * args.concurrency
    overload_clients = OVERLOAD_FACTOR * args.max_concurrent_requests
    args.overload_requests = args.overload_requests or 2 * overload_clients
    # Windows never overlap: a short run compares its first and last thirds.
    args.window = min(args.window, args.requests // 3)
    return args


def start_server(args: argparse.Namespace, model_dir: Path) -> tuple[ManagedServer, str]:
    root = args.adapter_dir or default_root(model_dir, args.lora_rank)
    ((name, path),) = build_adapters(model_dir, root, count=1, rank=args.lora_rank).items()
    flags = ["--max-concurrent-requests", str(args.max_concurrent_requests),
             "--lora-adapters", f"{name}={path}", *shlex.split(args.switchyard_args)]  # fmt: skip
    # Requests end at EOS as users' do: real lengths, and grammars that can finish.
    server = switchyard(model_dir, flags, ignore_eos=False)
    server.start(args.out / "logs")
    try:
        print(f"server ready in {server.wait_ready(args.startup_timeout):.1f} s", flush=True)
    except BaseException:
        server.stop()
        raise
    return server, name


async def drive(
    args: argparse.Namespace, server: ManagedServer, adapter: str
) -> tuple[dict[str, Any], list[Verdict]]:
    """The load, the overload and the criteria: (figures for the JSON, verdicts)."""
    url, total = server.base_url, args.warmup + args.requests
    assert server.proc is not None
    procs = server_processes(server.proc.pid)
    mix = Mix(drop=args.drop, max_tokens=args.max_tokens)
    first = range(args.warmup, args.warmup + args.window)
    last = range(total - args.window, total)
    reqs = replay_window(make_requests(total, args.seed, mix, server.model, adapter), first, last)
    answered, stop = [0], asyncio.Event()
    samples: list[RssSample] = []

    def done(outcome: Outcome) -> None:
        answered[0] += 1
        if answered[0] % 500 == 0:
            print(f"  {answered[0]}/{total} answered", flush=True)

    sampler = asyncio.create_task(
        sample_every(procs, args.rss_interval, lambda: answered[0], samples, stop)
    )
    t0 = time.monotonic()
    outcomes = await run_all(url, reqs, args.concurrency, done)
    load_s = time.monotonic() - t0
    stop.set()
    await sampler
    idle_load = await asyncio.to_thread(wait_idle, url, args.idle_timeout)

    clients = OVERLOAD_FACTOR * args.max_concurrent_requests
    print(f"overload: {args.overload_requests} requests, {clients} at once", flush=True)
    # The same mix, never dropped: every accepted request must be seen to its end.
    kept = dataclasses.replace(mix, drop=0.0)
    burst = make_requests(args.overload_requests, args.seed, kept, server.model, adapter, total)
    t0 = time.monotonic()
    overload = await run_all(url, burst, clients)
    print(f"overload answered in {time.monotonic() - t0:.1f} s", flush=True)
    idle_overload = await asyncio.to_thread(wait_idle, url, args.idle_timeout)

    verdicts = [
        errors_verdict(outcomes),
        idle_verdict({"after the load": idle_load, "after the overload": idle_overload}),
        rss_verdict(samples, first, last),
        latency_verdict(outcomes, first, last),
        overload_verdict(overload),
    ]
    figures = {
        "load_s": load_s,
        "requests_per_s": total / load_s,
        "outcomes": _tally(outcomes),
        "overload_outcomes": _tally(overload),
        "rss_samples": [asdict(s) for s in samples],
    }
    return figures, verdicts


def _tally(outcomes: list[Outcome]) -> dict[str, Any]:
    """Per route and feature: how requests ended, and completed requests' median latency."""
    rows: dict[str, dict[str, Any]] = {}
    latencies: dict[str, list[float]] = {}
    for o in outcomes:
        for feature in o.features:
            row = rows.setdefault(feature, {"completed": 0, "dropped": 0, "errors": 0})
            row["errors" if o.error else "dropped" if o.dropped else "completed"] += 1
            if o.completed:
                latencies.setdefault(feature, []).append(o.latency_s)
    for feature, values in latencies.items():
        rows[feature]["p50_s"] = statistics.median(values)
    return rows


def summary(verdicts: list[Verdict]) -> str:
    return "\n".join(
        f"  {'PASS' if v.passed else 'FAIL'}  {v.name:<9} {v.detail}" for v in verdicts
    )


def soak(argv: list[str] | None = None) -> tuple[dict[str, Any], list[Verdict]]:
    """Runs the whole soak: (what was written to the JSON, the verdicts)."""
    args = parse_args(argv)
    model_dir, model_label = resolve_model(args)
    server, adapter = start_server(args, model_dir)
    try:
        figures, verdicts = asyncio.run(drive(args, server, adapter))
    finally:
        server.stop()
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    result = {
        "model": model_label,
        "config": config,
        "argv": server.argv,
        "passed": all(v.passed for v in verdicts),
        "verdicts": [asdict(v) for v in verdicts],
        **figures,
    }
    path = write_results(args.out, "soak", result)
    total = args.warmup + args.requests
    print(f"soak: {total} requests in {figures['load_s']:.0f} s "
          f"({figures['requests_per_s']:.1f}/s), {model_label}")  # fmt: skip
    print(summary(verdicts))
    print(f"{'PASS' if result['passed'] else 'FAIL'}; results: {path}", flush=True)
    return result, verdicts


def main(argv: list[str] | None = None) -> int:
    result, _ = soak(argv)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
