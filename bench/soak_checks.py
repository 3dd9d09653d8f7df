"""The soak's criteria (issue 47, 5), each a Verdict: pass or fail, and the figures behind it.

- errors: every request answered as it should be (200, no error event, a complete stream,
  choices and texts as asked), the client's intended drops aside;
- idle: once the batch and the queue are empty, every KV block, concurrency permit and LoRA
  slot is free again (/metrics);
- rss: router and shard resident memory at the end within 5% of what it was after warm-up
  (medians of the samples taken over the first and the last window of requests; growth is
  what a leak looks like, so only growth fails);
- latency: p99 of the last window's completed requests within 10% of the first window's (the
  last window replays the first's requests: the same work, so only the server can differ);
- overload: at 4x --max-concurrent-requests, every answer a 200 that completes or a 429
  `overloaded`, nothing else, and both seen.
"""

from __future__ import annotations

import math
import statistics
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.serve_metrics import parse_prometheus
from bench.soak_client import Outcome
from bench.soak_rss import RssSample

# Zero on an idle server: the first two say it is idle, the rest what must have come back.
IDLE_ZERO = (
    "tgi_batch_current_size",
    "tgi_queue_size",
    "switchyard_requests_in_flight",
    "switchyard_kv_blocks_used",
    "switchyard_lora_adapters_live",
)
RSS_GROWTH = 0.05
P99_GROWTH = 0.10


@dataclass(frozen=True)
class Verdict:
    name: str
    passed: bool
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)


def scrape(base_url: str) -> dict[str, float]:
    """The unlabelled samples of GET /metrics."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as resp:
        samples = parse_prometheus(resp.read().decode())
    return {name: value for (name, labels), value in samples.items() if not labels}


@dataclass(frozen=True)
class Idle:
    metrics: dict[str, float]
    waited_s: float

    @property
    def clean(self) -> bool:
        free, total = (self.metrics.get(f"switchyard_kv_blocks_{k}") for k in ("free", "total"))
        return free == total and all(self.metrics.get(n, 0.0) == 0 for n in IDLE_ZERO)

    def describe(self) -> str:
        shown = (*IDLE_ZERO, "switchyard_kv_blocks_free", "switchyard_kv_blocks_total")
        values = ", ".join(f"{n}={self.metrics.get(n)}" for n in shown)
        return f"after {self.waited_s:.1f} s: {values}"


def wait_idle(base_url: str, timeout_s: float = 30.0, poll_s: float = 0.25) -> Idle:
    """The first scrape that is clean, or the last one when `timeout_s` passes first
    (cancellations of dropped streams reach the scheduler within a step or two)."""
    t0 = time.monotonic()
    while True:
        idle = Idle(scrape(base_url), time.monotonic() - t0)
        if idle.clean or idle.waited_s > timeout_s:
            return idle
        time.sleep(poll_s)


def errors_verdict(outcomes: Sequence[Outcome]) -> Verdict:
    bad = [o for o in outcomes if o.error]
    by_kind = Counter(o.kind for o in bad)
    examples = [f"#{o.index} {o.kind}: {o.error}" for o in bad[:10]]
    dropped = sum(o.dropped for o in outcomes)
    detail = f"{len(bad)} of {len(outcomes)} ({dropped} dropped on purpose)"
    return Verdict("errors", not bad, detail, {"by_kind": dict(by_kind), "examples": examples})


def idle_verdict(idles: dict[str, Idle]) -> Verdict:
    dirty = {when: idle.describe() for when, idle in idles.items() if not idle.clean}
    detail = "; ".join(f"{when}: {d}" for when, d in dirty.items()) or "every block free"
    figures = {when: idle.metrics for when, idle in idles.items()}
    return Verdict("idle", not dirty, detail, figures)


def p99(values: Sequence[float]) -> float:
    """Nearest rank: the value 99% of the others are at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] if ordered else float("nan")


def window_latencies(outcomes: Sequence[Outcome], lo: int, hi: int) -> list[float]:
    """Latencies of the requests lo..hi-1 that ran to their end (a drop's time is the
    client's choice)."""
    return [o.latency_s for o in outcomes if lo <= o.index < hi and o.completed]


def latency_verdict(outcomes: Sequence[Outcome], first: range, last: range) -> Verdict:
    a = p99(window_latencies(outcomes, first.start, first.stop))
    b = p99(window_latencies(outcomes, last.start, last.stop))
    ratio = b / a if a > 0 else float("nan")
    detail = f"p99 {a * 1000:.0f} ms (#{first.start}-{first.stop - 1}) -> {b * 1000:.0f} ms "
    detail += f"(#{last.start}-{last.stop - 1}), x{ratio:.3f}"
    figures = {
        "first_p99_s": a,
        "last_p99_s": b,
        "ratio": ratio,
        # Whether the whole distribution moved, or only its tail: and a trend between.
        "first_p50_s": median(window_latencies(outcomes, first.start, first.stop)),
        "last_p50_s": median(window_latencies(outcomes, last.start, last.stop)),
        "p99_every_window_s": [
            p99(window_latencies(outcomes, lo, lo + len(first)))
            for lo in range(first.start, last.stop, len(first))
        ],
    }
    return Verdict("latency", ratio <= 1 + P99_GROWTH, detail, figures)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def rss_verdict(samples: Sequence[RssSample], first: range, last: range) -> Verdict:
    """Medians over the samples taken while the first and the last window were answered."""
    early = [s for s in samples if first.start <= s.done <= first.stop]
    late = [s for s in samples if s.done >= last.start]
    if not early or not late:
        return Verdict("rss", False, f"too few samples ({len(early)} early, {len(late)} late)")
    growth: dict[str, float] = {}
    for name in early[0].rss:
        start = statistics.median(s.rss[name] for s in early)
        end = statistics.median(s.rss[name] for s in late)
        growth[name] = end / start - 1
    detail = ", ".join(f"{name} {g * 100:+.1f}%" for name, g in growth.items())
    figures = {"growth": growth, "samples": [len(early), len(late)]}
    return Verdict("rss", all(g <= RSS_GROWTH for g in growth.values()), detail, figures)


def overload_verdict(outcomes: Sequence[Outcome]) -> Verdict:
    def refusal(o: Outcome) -> bool:
        return o.status == 429 and o.error_type == "overloaded"

    accepted = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if refusal(o)]
    lost = [o for o in accepted if o.error]
    other = [o for o in outcomes if o.status != 200 and not refusal(o)]
    statuses = Counter(str(o.status) for o in outcomes)
    detail = f"{len(accepted)} accepted ({len(lost)} lost), {len(refused)} refused, "
    detail += f"{len(other)} other"
    examples = [f"#{o.index} {o.kind}: {o.error}" for o in (lost + other)[:10]]
    passed = not lost and not other and bool(accepted) and bool(refused)
    return Verdict("overload", passed, detail, {"statuses": dict(statuses), "examples": examples})
