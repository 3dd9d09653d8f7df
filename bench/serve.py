"""Serving benchmark: streaming requests against OpenAI-compatible servers, side by side.

    .venv/bin/python -m bench.serve                          # Switchyard vs transformers serve
    .venv/bin/python -m bench.serve --servers switchyard --concurrency 1 4 --num-prompts 8
    .venv/bin/python -m bench.serve --attach vllm=http://host:8000 --servers ''

For each server in turn (never two at once: they share the CPU), it starts the server (or
attaches to a running one), warms it up, then runs every level: a concurrency level keeps N
requests in flight; a rate level sends Poisson arrivals. Every request has a prompt of exactly
--input-len tokens and asks for up to --output-len tokens; a request that ends at EOS is
measured as it ended (its tokens as the server counts them, its end when the stream ends), unless
--ignore-eos makes every request generate --output-len tokens. Results: a table per server and
level, ratios against the baseline, JSON and a PNG plot under --out. Default model: the real
SmolLM2-135M-Instruct (the launcher's default model); --random-weights runs the random-weight
model of the same shape (bench/build_smollm_shape.py) on which earlier figures were measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import random
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import serve_metrics
from bench.models import add_model_args, resolve_model
from bench.results_file import package_version
from bench.serve_client import (
    Endpoint,
    Job,
    detect_api,
    new_session,
    run_concurrency,
    run_rate,
    send,
)
from bench.serve_prompts import PromptFactory
from bench.serve_report import level_label, plot, report
from bench.serve_stats import RequestResult, summarize
from bench.servers import FACTORIES, ManagedServer


@dataclass(frozen=True)
class Level:
    mode: str  # "concurrency" | "rate"
    value: float
    # "fixed": every prompt --input-len tokens, every output up to --output-len; "random":
    # vLLM benchmark_serving's random dataset, each request's lengths drawn uniformly within
    # --random-range-ratio of those means.
    dataset: str = "fixed"


# A server whose TTFT p50 at some level passes this many times its own TTFT for one request
# alone is starved or misconfigured (a KV cache too small for the level, a queue that never
# drains): its figures would measure the configuration, not the server.
STARVED_TTFT_FACTOR = 10


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="every request generates --output-len tokens (default: requests end at EOS)",
    )
    p.add_argument(
        "--servers",
        default="switchyard,transformers",
        help="comma list to start; transformers runs at its own defaults, "
        "transformers-equal-kv with the KV memory of a Switchyard CPU shard",
    )
    p.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="measure a running server instead of starting one (repeatable)",
    )
    p.add_argument(
        "--api",
        choices=["auto", "openai", "tgi"],
        default="auto",
        help="auto: /v1/completions, else TGI /generate_stream",
    )
    p.add_argument("--extra-body", default="{}", help="JSON merged into attached servers' requests")
    p.add_argument("--switchyard-args", default="", help="extra launcher flags (one string)")
    p.add_argument("--transformers-args", default="", help="extra `transformers serve` flags")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument(
        "--datasets",
        nargs="+",
        choices=["fixed", "random"],
        default=["fixed", "random"],
        help="fixed lengths, and/or vLLM-style random lengths around them",
    )
    p.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.5,
        help="random dataset: lengths uniform in [L (1 - r), L (1 + r)] (vLLM's flag)",
    )
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 16, 32])
    p.add_argument(
        "--request-rate", type=float, nargs="*", default=[], help="Poisson levels, req/s"
    )
    p.add_argument(
        "--max-concurrency", type=int, default=None, help="cap in flight for rate levels"
    )
    p.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help="requests per level (default: max(--min-prompts, --prompts-per-client x N))",
    )
    p.add_argument("--prompts-per-client", type=int, default=2)
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument("--warmup-output-len", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline", default="transformers", help="ratios are server / baseline")
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    return p.parse_args(argv)


def levels_of(args: argparse.Namespace) -> list[Level]:
    return [
        level
        for dataset in args.datasets
        for level in [Level("concurrency", c, dataset) for c in args.concurrency]
        + [Level("rate", r, dataset) for r in args.request_rate]
    ]


def prompts_for(args: argparse.Namespace, level: Level) -> int:
    if args.num_prompts:
        return args.num_prompts
    clients = level.value if level.mode == "concurrency" else (args.max_concurrency or 8)
    return max(args.min_prompts, int(args.prompts_per_client * clients))


class Workload:
    """Identical prompts for every server: level i, request j always gets the same text."""

    def __init__(self, args: argparse.Namespace, model_dir: Path) -> None:
        self.args = args
        self.factory = PromptFactory(model_dir, seed=args.seed)

    def jobs(self, level_index: int, n: int, dataset: str = "fixed") -> list[Job]:
        args, offset = self.args, 10_000 * (level_index + 1)
        if dataset == "fixed":
            texts = self.factory.many(args.input_len, n, offset=offset)
            return [Job(t, args.input_len, args.output_len) for t in texts]
        rng = random.Random(f"{args.seed}:{level_index}")
        lengths = [
            (around(rng, args.input_len, args.random_range_ratio),
             around(rng, args.output_len, args.random_range_ratio))
            for _ in range(n)
        ]  # fmt: skip
        return [Job(self.factory.make(i, offset + k), i, o) for k, (i, o) in enumerate(lengths)]

    def warmup_jobs(self, n: int) -> list[Job]:
        texts = self.factory.many(self.args.input_len, n, offset=0)
        return [Job(t, self.args.input_len, self.args.warmup_output_len) for t in texts]


def around(rng: random.Random, mean: int, ratio: float) -> int:
    """A length uniform in [mean (1 - ratio), mean (1 + ratio)], at least 1 (vLLM's rule)."""
    return max(1, rng.randint(int(mean * (1 - ratio)), int(mean * (1 + ratio))))


async def warm_up(ep: Endpoint, workload: Workload, widest: int) -> None:
    """One request alone (lazy init: transformers builds its CB cache on the first request), then
    a batch as wide as the widest level (batch-shape allocations), so no level pays for either."""
    async with new_session(1) as session:
        first = await send(session, ep, workload.warmup_jobs(1)[0])
    if not first.ok:
        raise RuntimeError(f"warm-up request failed: {first.error}")
    results = await run_concurrency(ep, workload.warmup_jobs(widest), widest)
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} warm-up requests failed, e.g. {failed[0]}")


async def run_level(
    ep: Endpoint, args: argparse.Namespace, level: Level, jobs: list[Job]
) -> list[RequestResult]:
    if level.mode == "concurrency":
        return await run_concurrency(ep, jobs, int(level.value))
    return await run_rate(ep, jobs, level.value, args.max_concurrency, args.seed)


async def measure(
    ep: Endpoint, args: argparse.Namespace, workload: Workload
) -> list[dict[str, Any]]:
    levels = levels_of(args)
    widest = max(
        [int(lv.value) for lv in levels if lv.mode == "concurrency"] + [args.max_concurrency or 1]
    )
    t0 = time.perf_counter()
    await warm_up(ep, workload, widest)
    print(f"  warm-up done in {time.perf_counter() - t0:.1f} s", flush=True)
    out = []
    async with new_session(1) as session:
        for i, level in enumerate(levels):
            jobs = workload.jobs(i, prompts_for(args, level), level.dataset)
            before = await serve_metrics.scrape(session, ep.base_url)
            results = await run_level(ep, args, level, jobs)
            after = await serve_metrics.scrape(session, ep.base_url)
            summary = summarize(results)
            entry: dict[str, Any] = {
                "mode": level.mode,
                "value": level.value,
                "dataset": level.dataset,
                "summary": summary.to_dict(),
            }
            if before is not None and after is not None:
                entry["shard_time"] = serve_metrics.shard_time(
                    before, after, summary.duration_s
                ).to_dict()
            out.append(entry)
            s = summary
            print(
                f"  {level.mode}={level.value:g} {level.dataset}: {s.completed} ok, "
                f"{s.failed} failed, "
                f"{s.output_throughput:.1f} out tok/s, TTFT p50 {s.ttft_s.p50 * 1e3:.0f} ms, "
                f"ITL p99 {s.itl_s.p99 * 1e3:.1f} ms, {s.duration_s:.1f} s",
                flush=True,
            )
            if summary.errors:
                print(f"    errors: {summary.errors}", flush=True)
    return out


async def bench_server(
    server: ManagedServer | None,
    name: str,
    url: str,
    model: str,
    extra_body: dict[str, Any],
    args: argparse.Namespace,
    workload: Workload,
) -> dict[str, Any]:
    async with new_session(1) as session:
        api = await detect_api(session, url, model, args.api)
    ep = Endpoint(url, api, model, extra_body if api == "openai" else {})
    print(f"[{name}] {url} api={api}", flush=True)
    levels = await measure(ep, args, workload)
    single = await single_request_ttft(ep, workload)
    print(f"  one request alone: TTFT {single * 1e3:.0f} ms (median of {SINGLE_PROBES})")
    info: dict[str, Any] = {
        "url": url,
        "api": api,
        "extra_body": ep.extra_body,
        "levels": levels,
        "single_request_ttft_s": single,
    }
    if server is not None:
        info["command"] = shlex.join(server.argv)
    return info


SINGLE_PROBES = 3


async def single_request_ttft(ep: Endpoint, workload: Workload) -> float:
    """The server's TTFT with nothing else in flight: the yardstick of the starvation check."""
    ttfts = []
    async with new_session(1) as session:
        for job in workload.jobs(-1, SINGLE_PROBES):
            result = await send(session, ep, job)
            if not result.ok or result.ttft is None:
                raise RuntimeError(f"single-request probe failed: {result.error or 'no token'}")
            ttfts.append(result.ttft)
    return sorted(ttfts)[len(ttfts) // 2]


def starved_levels(results: dict[str, Any]) -> list[str]:
    """Every (server, level) whose TTFT p50 passes STARVED_TTFT_FACTOR x its single-request TTFT."""
    out = []
    for name, server in results["servers"].items():
        single = server.get("single_request_ttft_s")
        if not single:
            continue
        for level in server["levels"]:
            p50 = level["summary"]["ttft_s"]["p50"]
            if p50 is not None and p50 > STARVED_TTFT_FACTOR * single:
                out.append(
                    f"{name} {level_label(level)}: TTFT p50 {p50:.2f} s > "
                    f"{STARVED_TTFT_FACTOR} x its single-request TTFT {single:.3f} s"
                )
    return out


def environment(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    return {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model_dir": str(model_dir),
        "model_name": model_dir.name,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "cpu": f"{cpu}, {os.cpu_count()} logical CPUs",
        "load_average_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "versions": {
            p: package_version(p)
            for p in ("switchyard", "torch", "transformers", "aiohttp", "grpcio")
        },
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }


def _no_nan(obj: Any) -> Any:
    """JSON has no NaN: undefined figures (e.g. TPOT of 1-token outputs) become null."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _no_nan(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_no_nan(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model_dir, model_label = resolve_model(args)
    print(f"model: {model_label} ({model_dir})", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    workload = Workload(args, model_dir)
    meta = {**environment(args, model_dir), "model": model_label, "ignore_eos": args.ignore_eos}
    results: dict[str, Any] = {"meta": meta, "servers": {}}

    for spec in args.attach:
        name, _, url = spec.partition("=")
        extra = json.loads(args.extra_body)
        results["servers"][name] = asyncio.run(
            bench_server(None, name, url.rstrip("/"), str(model_dir), extra, args, workload)
        )
    for name in [s for s in args.servers.split(",") if s]:
        # transformers-equal-kv takes the --transformers-args too
        extra_args = shlex.split(getattr(args, f"{name.split('-')[0]}_args", ""))
        server = FACTORIES[name](model_dir, extra_args, ignore_eos=args.ignore_eos)
        server.start(args.out / "logs")
        try:
            print(
                f"[{name}] ready after {server.wait_ready(args.startup_timeout):.1f} s", flush=True
            )
            results["servers"][name] = asyncio.run(
                bench_server(
                    server, name, server.base_url, server.model, server.extra_body, args, workload
                )
            )
        finally:
            server.stop()

    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = args.out / f"serve-{stamp}.json"
    json_path.write_text(json.dumps(_no_nan(results), indent=2))
    print()
    print(report(_no_nan(results), args.baseline))
    png = args.out / f"serve-{stamp}.png"
    plot(_no_nan(results), png)
    print(f"\nresults: {json_path}\nplot:    {png}")
    starved = starved_levels(_no_nan(results))
    if starved:
        # Loud, and after the results are on disk: they show what went wrong.
        raise SystemExit(
            "SANITY CHECK FAILED: a server looks starved or misconfigured; its figures are not a "
            "fair measurement:\n  " + "\n  ".join(starved)
        )


if __name__ == "__main__":
    main()
