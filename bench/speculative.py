"""Speculative decoding benchmark: the same server with and without n-gram speculation, side by
side in one run, on the real demo model (SmolLM2-135M-Instruct) by default.

    .venv/bin/python -m bench.speculative
    .venv/bin/python -m bench.speculative --speculate-args "--speculative-config {...}" \\
        --concurrency 1 4 16 --workloads grounded chat

Two workloads, sent through /v1/chat/completions with greedy decoding (temperature 0) and the
model's own stop (EOS):
- grounded: the answer repeats most of the request (edit a given function, correct a given
  paragraph): what prompt lookup is for;
- chat: open questions, whose answers have little of the prompt in them.
For each workload and concurrency level the servers answer the same requests; the benchmark
prints output tokens per second for each, their ratio (speculative / plain), the acceptance the
speculative server reports on /metrics, and how many answers have the same text on both. At
concurrency 1 every answer must be identical (greedy speculation is exact, and the CPU's rows
kernel gives a row the same logits in a verify step as alone): a difference fails the run. With
several requests in flight, rows share steps with other rows' prompt chunks, whose half-precision
sums depend on the batch (as in any server), so a near-tie may go either way on either server;
those counts are reported, not required. The servers run one at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import shlex
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.models import add_model_args, resolve_model
from bench.results_file import package_version
from bench.servers import switchyard

CODE = '''def {name}(items, limit):
    """Return the running totals of items, stopping once a total passes limit."""
    totals = []
    running = 0
    for item in items:
        running += item
        if running > limit:
            break
        totals.append(running)
    return totals


def average_{name}(items, limit):
    totals = {name}(items, limit)
    if not totals:
        return 0.0
    return sum(totals) / len(totals)
'''
PARAGRAPH = (
    "The city council met on {day} to discuss the new park. Many residents said that the park "
    "should have more trees, a larger playground and a quiet area for reading. The council "
    "agreed to publish a plan by the end of the month and to ask for comments from everyone "
    "who lives nearby. The meeting ended at nine o'clock after a long debate about parking."
)
NAMES = ["cumulative", "capped_sums", "prefix_totals", "bounded_running", "partial_sums",
         "limited_totals", "running_totals", "sum_until"]  # fmt: skip
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "Sunday"]
CHAT = [
    "What are three good habits for staying healthy?",
    "Explain why the sky is blue in simple words.",
    "Write a short poem about the sea.",
    "Give me some tips for learning a new language.",
    "What is the difference between a virus and a bacterium?",
    "Describe a good way to plan a weekend trip.",
    "Why do people enjoy music?",
    "How does a bicycle stay upright?",
]


def grounded_prompts(n: int) -> list[str]:
    prompts = []
    for i in range(n):
        if i % 2 == 0:
            name = NAMES[i % len(NAMES)]
            prompts.append(
                "Rewrite this Python code exactly, but rename the variable `running` to "
                f"`total_so_far`. Reply with the code only.\n\n{CODE.format(name=name)}"
            )
        else:
            text = PARAGRAPH.format(day=DAYS[i % len(DAYS)])
            prompts.append(f"Repeat this paragraph, replacing 'council' with 'board':\n\n{text}")
    return prompts


def chat_prompts(n: int) -> list[str]:
    return [CHAT[i % len(CHAT)] for i in range(n)]


WORKLOADS = {"grounded": grounded_prompts, "chat": chat_prompts}


@dataclass
class Answer:
    text: str
    tokens: int


@dataclass
class Run:
    tokens: int
    seconds: float
    answers: list[Answer]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


async def _ask(session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        data = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {data}")
    return Answer(data["choices"][0]["message"]["content"], data["usage"]["completion_tokens"])


async def _run(url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> Run:
    answers: list[Answer | None] = [None] * len(prompts)
    queue = list(enumerate(prompts))
    timeout = aiohttp.ClientTimeout(total=None, sock_read=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def client() -> None:
            while queue:
                i, prompt = queue.pop(0)
                answers[i] = await _ask(session, url, model, prompt, max_tokens)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        seconds = time.perf_counter() - start
    done = [a for a in answers if a is not None]
    return Run(sum(a.tokens for a in done), seconds, done)


def _metric(url: str, name: str) -> dict[str, float]:
    """The values of a Prometheus counter by its labels' text ('' without labels)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    found = {}
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:_total)?(\{{[^}}]*\}})?\s+(\S+)$", line)
        if m:
            found[m.group(1) or ""] = float(m.group(2))
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument(
        "--speculate-args", default="--speculate 4", help="the speculative server's flags"
    )
    p.add_argument("--switchyard-args", default="", help="flags both servers get")
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 4, 16])
    p.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--num-prompts", type=int, default=8, help="per workload and level (min)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)
    model_dir, model_name = resolve_model(args)
    common = shlex.split(args.switchyard_args)
    servers = {"plain": common, "speculative": common + shlex.split(args.speculate_args)}
    cells = [(w, c) for w in args.workloads for c in args.concurrency]
    results: dict[str, dict[tuple[str, int], Run]] = {}
    acceptance: dict[str, dict] = {}
    log_dir = args.out / "speculative-logs"
    for name, extra in servers.items():
        server = switchyard(model_dir, extra, ignore_eos=False)
        server.name = f"switchyard-{name}"
        server.start(log_dir)
        try:
            server.wait_ready(600)
            url = server.base_url
            asyncio.run(_run(url, server.model, chat_prompts(2), 2, 16))  # warm up
            results[name] = {}
            for workload, concurrency in cells:
                n = max(args.num_prompts, concurrency)
                prompts = WORKLOADS[workload](n)
                before = _counters(url)
                run = asyncio.run(_run(url, server.model, prompts, concurrency, args.max_tokens))
                results[name][(workload, concurrency)] = run
                after = _counters(url)
                acceptance.setdefault(f"{workload}@{concurrency}", {})[name] = {
                    k: after.get(k, 0.0) - before.get(k, 0.0) for k in after
                }
                print(f"[{name}] {workload} c={concurrency}: {run.tokens} tokens in "
                      f"{run.seconds:.1f} s = {run.tok_s:.1f} tok/s", flush=True)  # fmt: skip
        finally:
            server.stop()
    return _report(args, model_name, servers, cells, results, acceptance)


def _counters(url: str) -> dict[str, float]:
    drafts = _metric(url, "switchyard_spec_decode_num_draft_tokens")
    accepted = _metric(url, "switchyard_spec_decode_num_accepted_tokens")
    return {"draft_tokens": sum(drafts.values()), "accepted_tokens": sum(accepted.values())}


def _report(args, model_name, servers, cells, results, acceptance) -> int:
    print(f"\nmodel: {model_name}; host: {platform.processor() or platform.machine()}; "
          f"switchyard {package_version('switchyard') or '(checkout, not installed)'}")  # fmt: skip
    for name, flags in servers.items():
        print(f"  {name}: launcher {' '.join(flags) or '(defaults)'}")
    print(f"\n{'workload':<10}{'conc':>5}{'plain tok/s':>13}{'spec tok/s':>12}{'ratio':>8}"
          f"{'accept':>9}{'same text':>11}")  # fmt: skip
    rows, mismatches = [], 0  # at concurrency 1
    for workload, concurrency in cells:
        plain = results["plain"][(workload, concurrency)]
        spec = results["speculative"][(workload, concurrency)]
        same = [a.text == b.text for a, b in zip(plain.answers, spec.answers, strict=True)]
        if concurrency == 1:
            mismatches += same.count(False)
        counts = acceptance[f"{workload}@{concurrency}"]["speculative"]
        rate = counts["accepted_tokens"] / counts["draft_tokens"] if counts["draft_tokens"] else 0
        ratio = spec.tok_s / plain.tok_s if plain.tok_s else 0.0
        print(f"{workload:<10}{concurrency:>5}{plain.tok_s:>13.1f}{spec.tok_s:>12.1f}"
              f"{ratio:>7.2f}x{rate:>9.2f}{sum(same):>6}/{len(same)}")  # fmt: skip
        rows.append(dict(workload=workload, concurrency=concurrency, plain_tok_s=plain.tok_s,
                         speculative_tok_s=spec.tok_s, ratio=ratio, acceptance=rate,
                         identical=sum(same), answers=len(same)))  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "speculative.json"
    out.write_text(json.dumps({"model": model_name, "servers": servers, "rows": rows}, indent=2))
    print(f"\nresults: {out}")
    if mismatches:
        print(f"FAIL: {mismatches} answer(s) at concurrency 1 differ between the servers")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
