"""Prefix caching benchmark (issue 16): Switchyard with caching on vs off, and vs `transformers
serve` (as bench/servers.py runs it), on the SmolLM2-135M-shaped model, CPU, one run.

    .venv/bin/python -m bench.prefix_cache [--requests 24] [--out bench/results]

(a) shared: a 1,000-token system prompt + distinct 64-token questions, 8 clients: TTFT p50 and
    output tokens/s (goal: TTFT p50 >= 5x lower with caching on);
(b) chat: conversations of 8 turns, each resending the history (answers included): total time;
(c) distinct: prompts sharing nothing, 8 clients: output tokens/s (goal: caching costs <= 3%).
Greedy, ignore_eos (every request generates its max_tokens). JSON under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from bench.results_file import write_results
from bench.serve import environment
from bench.serve_client import Endpoint, Job, new_session, run_concurrency, send
from bench.serve_prompts import PromptFactory
from bench.serve_stats import RequestResult, percentile, run_duration
from bench.servers import ManagedServer, switchyard, transformers_serve

LIMITS = ["--max-input-tokens", "2048", "--max-total-tokens", "2112"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--requests", type=int, default=24, help="requests in (a) and (c)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--conversations", type=int, default=2, help="(b), run side by side")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    # What bench.serve.environment records: (a)'s prompt length, ~1,000 + 64 tokens.
    p.set_defaults(input_len=1064)
    return p.parse_args(argv)


class Workloads:
    def __init__(self, factory: PromptFactory, args: argparse.Namespace) -> None:
        self.f, self.args = factory, args
        system = factory.make(1000, 10_000)
        self.shared = [self.job(system + factory.make(64, i)) for i in range(args.requests)]
        self.distinct = [self.job(factory.make(512, 20_000 + i)) for i in range(args.requests)]
        self.chat_system = factory.make(200, 30_000)

    def job(self, prompt: str) -> Job:
        return Job(prompt, self.f.count(prompt), self.args.output_len)


def stats(results: list[RequestResult]) -> dict[str, float]:
    bad = [r.error for r in results if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} requests failed: {bad[:3]}")
    duration = run_duration(results)
    return {
        "requests": len(results),
        "ttft_p50_s": percentile([r.ttft for r in results if r.ttft is not None], 50),
        "output_tok_s": sum(r.output_tokens for r in results) / duration,
        "duration_s": duration,
    }


async def chat(ep: Endpoint, w: Workloads) -> dict[str, float]:
    """Conversations side by side; each turn waits for the previous answer."""
    t0 = time.monotonic()

    async def conversation(c: int) -> None:
        history = w.chat_system
        async with new_session(1) as session:
            for turn in range(w.args.turns):
                history += w.f.make(64, 40_000 + 100 * c + turn)
                result = await send(session, ep, w.job(history))
                if not result.ok:
                    raise RuntimeError(result.error)
                history += f" answer {result.output_tokens} tokens."  # the answer's stand-in

    await asyncio.gather(*(conversation(c) for c in range(w.args.conversations)))
    return {"total_s": time.monotonic() - t0}


async def measure(ep: Endpoint, w: Workloads, parts: list[str]) -> dict[str, Any]:
    async with new_session(1) as session:  # warm-up, sharing nothing with the workloads
        await send(session, ep, w.job(w.f.make(64, 99_999)))
    out: dict[str, Any] = {}
    c = w.args.concurrency
    if "shared" in parts:
        out["shared"] = stats(await run_concurrency(ep, w.shared, c))
        print(f"  (a) shared: {out['shared']}", flush=True)
    if "chat" in parts:
        out["chat"] = await chat(ep, w)
        print(f"  (b) chat: {out['chat']}", flush=True)
    if "distinct" in parts:
        out["distinct"] = stats(await run_concurrency(ep, w.distinct, c))
        print(f"  (c) distinct: {out['distinct']}", flush=True)
    return out


def run_server(server: ManagedServer, w: Workloads, parts: list[str], logs: Path) -> dict:
    server.start(logs)
    try:
        print(f"[{server.name}] ready after {server.wait_ready(600):.1f} s", flush=True)
        ep = Endpoint(server.base_url, "openai", server.model, server.extra_body)
        return asyncio.run(measure(ep, w, parts))
    finally:
        server.stop()


def ratios(r: dict[str, dict]) -> dict[str, float]:
    on, off, hf = r["caching_on"], r["caching_off"], r["transformers"]
    return {
        "a_ttft_p50_off_over_on": off["shared"]["ttft_p50_s"] / on["shared"]["ttft_p50_s"],
        "a_ttft_p50_transformers_over_on": hf["shared"]["ttft_p50_s"] / on["shared"]["ttft_p50_s"],
        "a_out_tok_s_on_over_off": on["shared"]["output_tok_s"] / off["shared"]["output_tok_s"],
        "a_out_tok_s_on_over_transformers": on["shared"]["output_tok_s"]
        / hf["shared"]["output_tok_s"],
        "b_total_time_off_over_on": off["chat"]["total_s"] / on["chat"]["total_s"],
        "c_out_tok_s_on_over_off": on["distinct"]["output_tok_s"] / off["distinct"]["output_tok_s"],
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.model_dir is None:
        from bench.build_smollm_shape import build, default_dir

        args.model_dir = build(default_dir())
    model_dir = args.model_dir.resolve()
    w = Workloads(PromptFactory(model_dir), args)
    logs = args.out / "logs"
    all_parts = ["shared", "chat", "distinct"]
    results: dict[str, Any] = {"meta": environment(args, model_dir)}
    for name, flag in (("caching_on", "--prefix-caching"), ("caching_off", "--no-prefix-caching")):
        # The router's default input limit (1,024 on this model) is below (a)'s prompts.
        server = switchyard(model_dir, [flag, *LIMITS])
        server.name = f"switchyard-{name}"
        results[name] = run_server(server, w, all_parts, logs)
        results[name]["argv"] = server.argv
    peer = transformers_serve(model_dir, [])
    results["transformers"] = run_server(peer, w, ["shared"], logs)
    results["transformers"]["argv"] = peer.argv
    results["ratios"] = ratios(results)
    path = write_results(args.out, "prefix-cache", results)
    print(json.dumps(results["ratios"], indent=2))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
