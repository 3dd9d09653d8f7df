"""Figures of a serving run from per-request timings: pure functions, no I/O, no clocks.

Conventions (those of vLLM's and TGI's benchmarks):
- TTFT: send -> first token-carrying chunk.
- TPOT (per request): (e2e - ttft) / (output_tokens - 1), the mean gap after the first token;
  undefined for requests with fewer than 2 tokens.
- ITL: every gap between consecutive token-carrying chunks, pooled over requests. A chunk that
  carries several tokens (a server that coalesces, or a detokenizer holding back half a UTF-8
  character) is one gap, so ITL and TPOT differ exactly when servers coalesce.
- Throughput: tokens of successful requests / wall time of the run (first send -> last end).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int
    # Tokens generated: the server's own count (usage / details) when it gives one, else chunks.
    output_tokens: int
    start: float  # send time, seconds on the run's monotonic clock
    e2e: float  # seconds, send -> end of stream (or failure)
    ttft: float | None = None  # seconds; None when no token arrived
    # Arrival time of every token-carrying chunk, seconds after `start`.
    chunk_times: list[float] = field(default_factory=list)
    error: str = ""
    # What the server said about the prompt length (None when it does not say).
    server_prompt_tokens: int | None = None

    @property
    def end(self) -> float:
        return self.start + self.e2e

    @property
    def chunks(self) -> int:
        return len(self.chunk_times)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def tpot(result: RequestResult) -> float | None:
    if not result.ok or result.ttft is None or result.output_tokens < 2:
        return None
    return (result.e2e - result.ttft) / (result.output_tokens - 1)


def inter_token_gaps(result: RequestResult) -> list[float]:
    times = result.chunk_times
    return [b - a for a, b in pairwise(times)]


@dataclass(frozen=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if not values:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        p50, p90, p99 = (percentile(values, q) for q in PERCENTILES)
        return cls(len(values), sum(values) / len(values), p50, p90, p99, max(values))


@dataclass(frozen=True)
class Summary:
    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    chunks: int
    request_throughput: float  # successful requests / s
    output_throughput: float  # generated tokens / s
    total_token_throughput: float  # (prompt + generated) tokens / s
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    output_tokens_per_request: Distribution
    # Distinct error messages and how often each happened (first 5 by count).
    errors: dict[str, int]
    # Requests whose prompt length the server reported differently from the client's count.
    prompt_length_mismatches: int

    def to_dict(self) -> dict:
        return asdict(self)


def run_duration(results: Sequence[RequestResult]) -> float:
    """First send to last end: the wall time a throughput figure is taken over."""
    if not results:
        return 0.0
    return max(r.end for r in results) - min(r.start for r in results)


def summarize(results: Sequence[RequestResult], duration_s: float | None = None) -> Summary:
    duration = run_duration(results) if duration_s is None else duration_s
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)

    def rate(n: float) -> float:
        return n / duration if duration > 0 else math.nan

    errors = Counter(r.error or "unknown error" for r in results if not r.ok)
    return Summary(
        completed=len(ok),
        failed=len(results) - len(ok),
        duration_s=duration,
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        chunks=sum(r.chunks for r in ok),
        request_throughput=rate(len(ok)),
        output_throughput=rate(out_tokens),
        total_token_throughput=rate(out_tokens + in_tokens),
        ttft_s=Distribution.of([r.ttft for r in ok if r.ttft is not None]),
        tpot_s=Distribution.of([t for r in ok if (t := tpot(r)) is not None]),
        itl_s=Distribution.of([g for r in ok for g in inter_token_gaps(r)]),
        e2e_s=Distribution.of([r.e2e for r in ok]),
        output_tokens_per_request=Distribution.of([float(r.output_tokens) for r in ok]),
        errors=dict(errors.most_common(5)),
        prompt_length_mismatches=sum(
            1
            for r in ok
            if r.server_prompt_tokens is not None and r.server_prompt_tokens != r.prompt_tokens
        ),
    )
