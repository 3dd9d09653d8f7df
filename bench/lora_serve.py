"""Multi-LoRA serving on CPU (issue 12): output tok/s with requests spread over 1, 4 and 16
adapters against the base model alone, on ONE Switchyard server, ratios printed.

    .venv/bin/python -m bench.lora_serve                       # ~10 min on 2 cores
    .venv/bin/python -m bench.lora_serve --rounds 3 --num-prompts 64 --out bench/results/lora

Builds (or reuses) the SmolLM2-135M-shaped random model (bench/build_smollm_shape.py) and
--adapters PEFT adapters of it (bench/lora_adapters.py: rank 16, alpha 32, all seven
projections), starts one server with all of them (bench.servers.switchyard: bf16, the launcher's
defaults otherwise, so --max-loras 4), warms it up, then runs the same load per configuration:
base model only, then round-robin over the first 1, 4, 16 adapters. All configurations share
one server process, its warm-up and its memory state, so the only difference between them is
where the requests go. --rounds repeats the set, in reverse order every other round, so a
drift of the machine over time does not favour one configuration; ratios are taken against the
base run of the same round too. Output under --out: lora-serve-<time>.json and .md, logs/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import serve_metrics
from bench.lora_adapters import build_adapters, default_root, describe
from bench.lora_serve_report import report
from bench.lora_spread import PLACEMENTS, SpreadConfig, configs, run_concurrency, spread
from bench.serve import Workload, _no_nan, environment
from bench.serve_client import Endpoint, new_session, send
from bench.serve_stats import summarize
from bench.servers import switchyard

# Issue 12: output tok/s relative to the base model, by number of adapters.
GOALS = {4: 0.8, 16: 0.7}
ADAPTER_TOKENS = "switchyard_adapter_generated_tokens_total"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, default=None, help="default: the SmolLM2 shape")
    p.add_argument("--adapters", type=int, default=16, help="adapters built and served")
    p.add_argument("--spread", type=int, nargs="+", default=[1, 4, 16], help="adapter counts")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument(
        "--num-prompts", type=int, default=48, help="requests per run (3 per client at c=16)"
    )
    p.add_argument("--rounds", type=int, default=2, help="every configuration runs this often")
    p.add_argument("--warmup-output-len", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="round-robin",
        help="how requests pick their adapter; the issue's goals are judged on round-robin",
    )
    p.add_argument("--switchyard-args", default="", help="extra launcher flags (one string)")
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--out", type=Path, default=Path("bench/results/lora"))
    return p.parse_args(argv)


def round_order(items: list[SpreadConfig], round_index: int) -> list[SpreadConfig]:
    """Reversed every other round: each configuration runs early once and late once."""
    return items if round_index % 2 == 0 else list(reversed(items))


def adapter_tokens(samples: dict[tuple[str, str], float] | None) -> dict[str, float]:
    """Generated tokens per `adapter` label (base included), from a /metrics scrape."""
    out: dict[str, float] = {}
    for (name, labels), v in (samples or {}).items():
        if name == ADAPTER_TOKENS and labels.startswith('adapter="'):
            out[labels.split('"')[1]] = v
    return out


async def warm_up(ep: Endpoint, workload: Workload, all_adapters: SpreadConfig, c: int) -> None:
    """One request alone, a full-width base batch, then a full-width batch over every adapter
    (first slot copies, the grouped LoRA path's first calls), so no measured run pays for them."""
    async with new_session(1) as session:
        first = await send(session, ep, workload.warmup_jobs(1)[0])
    if not first.ok:
        raise RuntimeError(f"warm-up request failed: {first.error}")
    jobs = workload.warmup_jobs(c)
    for config in (SpreadConfig("base", ()), all_adapters):
        results = await run_concurrency(spread(ep, config, jobs), c)
        failed = [r.error for r in results if not r.ok]
        if failed:
            raise RuntimeError(f"{len(failed)} warm-up requests failed, e.g. {failed[0]}")


async def measure(
    ep: Endpoint,
    args: argparse.Namespace,
    workload: Workload,
    plan: list[SpreadConfig],
    save: Callable[[list[dict[str, Any]]], None],
) -> list[dict[str, Any]]:
    """Every run of every round; `save` gets the runs so far after each one, so a run cut short
    (or spoiled by another job on the machine) still leaves its finished runs on disk."""
    t0 = time.perf_counter()
    await warm_up(ep, workload, plan[-1], args.concurrency)
    print(f"  warm-up done in {time.perf_counter() - t0:.1f} s", flush=True)
    runs = []
    async with new_session(1) as session:
        for r in range(args.rounds):
            # Same prompts for every configuration of a round, new ones each round.
            jobs = workload.jobs(r, args.num_prompts)
            for config in round_order(plan, r):
                before = await serve_metrics.scrape(session, ep.base_url)
                requests = spread(ep, config, jobs, args.placement, seed=args.seed + r)
                results = await run_concurrency(requests, args.concurrency)
                after = await serve_metrics.scrape(session, ep.base_url)
                s = summarize(results)
                run: dict[str, Any] = {
                    "round": r,
                    "config": config.label,
                    "adapters": config.count,
                    "adapter_names": list(config.adapters),
                    "load_average_at_start": _loadavg(),
                    "summary": s.to_dict(),
                }
                if before is not None and after is not None:
                    run["shard_time"] = serve_metrics.shard_time(
                        before, after, s.duration_s
                    ).to_dict()
                    b, a = adapter_tokens(before), adapter_tokens(after)
                    # The server's own count of where tokens went: proves the spreading.
                    run["server_tokens_by_adapter"] = {
                        k: a[k] - b.get(k, 0.0) for k in a if a[k] - b.get(k, 0.0) > 0
                    }
                runs.append(run)
                save(runs)
                print(
                    f"  round {r} {config.label:>11}: {s.completed} ok, {s.failed} failed, "
                    f"{s.output_throughput:.1f} out tok/s, TTFT p50 {s.ttft_s.p50 * 1e3:.0f} ms, "
                    f"ITL p50 {s.itl_s.p50 * 1e3:.1f} / p99 {s.itl_s.p99 * 1e3:.1f} ms, "
                    f"{s.duration_s:.1f} s, load {run['load_average_at_start'][0]} at start",
                    flush=True,
                )
                if s.errors:
                    print(f"    errors: {s.errors}", flush=True)
    return runs


def _loadavg() -> list[float]:
    import os

    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.model_dir is None:
        from bench.build_smollm_shape import build, default_dir

        args.model_dir = build(default_dir())
    model_dir = args.model_dir.resolve()
    adapters = build_adapters(
        model_dir, default_root(model_dir, args.rank), args.adapters, args.rank, args.alpha
    )
    plan = configs(list(adapters), args.spread)
    args.out.mkdir(parents=True, exist_ok=True)
    workload = Workload(args, model_dir)

    lora_flag = ",".join(f"{n}={p}" for n, p in adapters.items())
    server = switchyard(
        model_dir, ["--lora-adapters", lora_flag, *shlex.split(args.switchyard_args)]
    )
    meta = environment(args, model_dir)
    meta["versions"]["peft"] = metadata.version("peft")
    meta |= {
        "command_line": shlex.join(["python", "-m", "bench.lora_serve", *(argv or [])]),
        "server_command": shlex.join(server.argv),
        "adapter": describe(next(iter(adapters.values()))),
        "placement": args.placement,
        # Judged on round-robin placement only: the random one shares adapters in flight.
        "goals": {str(k): v for k, v in GOALS.items()} if args.placement == "round-robin" else {},
        "fairness": "all configurations ran against one server process (same start, warm-up "
        "and memory), interleaved over rounds; only the requests' adapters differ",
    }
    path = args.out / f"lora-serve-{time.strftime('%Y%m%d-%H%M%S')}.json"

    def save(runs: list[dict[str, Any]]) -> None:
        results = _no_nan({"meta": meta, "runs": runs})
        path.write_text(json.dumps(results, indent=2))
        path.with_suffix(".md").write_text(report(results, markdown=True) + "\n")

    server.start(args.out / "logs")
    try:
        print(f"[switchyard] ready after {server.wait_ready(args.startup_timeout):.1f} s")
        # OpenAI completions: `model` is the served model name (base) or an adapter's name.
        ep = Endpoint(server.base_url, "openai", server.model, server.extra_body)
        runs = asyncio.run(measure(ep, args, workload, plan, save))
    finally:
        server.stop()

    results = _no_nan({"meta": meta, "runs": runs})
    print()
    print(f"One server for every configuration: {meta['server_command']}")
    print(report(results))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
