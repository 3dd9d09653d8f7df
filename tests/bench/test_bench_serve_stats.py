"""The serving benchmark's statistics on synthetic timings (no servers, no clocks)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from bench.serve_stats import (
    Distribution,
    RequestResult,
    inter_token_gaps,
    percentile,
    run_duration,
    summarize,
    tpot,
)


def ok(
    start: float, chunk_times: list[float], e2e: float, tokens: int | None = None
) -> RequestResult:
    return RequestResult(
        ok=True,
        prompt_tokens=10,
        output_tokens=len(chunk_times) if tokens is None else tokens,
        start=start,
        e2e=e2e,
        ttft=chunk_times[0] if chunk_times else None,
        chunk_times=chunk_times,
    )


def test_percentile_known_values():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([4, 1, 3, 2], 0) == 1
    assert percentile([4, 1, 3, 2], 100) == 4
    assert percentile([7.0], 99) == 7.0
    assert percentile([0, 10], 90) == pytest.approx(9.0)
    assert math.isnan(percentile([], 50))


def test_percentile_matches_numpy_linear():
    rng = random.Random(0)
    for n in (2, 3, 10, 101, 1000):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (1, 50, 90, 99, 99.9):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_rejects_out_of_range():
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_tpot_is_time_after_first_token_over_remaining_tokens():
    r = ok(0.0, [0.5, 0.6, 0.7, 0.8, 0.9], e2e=0.9)
    assert tpot(r) == pytest.approx((0.9 - 0.5) / 4)
    # A server that coalesced chunks: TPOT uses its token count, not the chunk count.
    coalesced = ok(0.0, [0.5, 0.9], e2e=0.9, tokens=5)
    assert tpot(coalesced) == pytest.approx(0.1)


def test_tpot_undefined_for_single_token_and_failures():
    assert tpot(ok(0.0, [0.3], e2e=0.3)) is None
    failed = RequestResult(
        ok=False, prompt_tokens=10, output_tokens=0, start=0.0, e2e=1.0, error="x"
    )
    assert tpot(failed) is None


def test_itl_is_every_gap_between_chunks():
    r = ok(0.0, [0.5, 0.6, 0.8, 1.1], e2e=1.2)
    assert inter_token_gaps(r) == pytest.approx([0.1, 0.2, 0.3])
    assert inter_token_gaps(ok(0.0, [0.5], e2e=0.5)) == []


def test_summarize_throughput_and_pooled_latencies():
    results = [
        ok(0.0, [1.0, 1.5, 2.0], e2e=2.0),  # 3 tokens, gaps 0.5, 0.5
        ok(1.0, [0.5, 0.6, 0.7, 0.8], e2e=1.0),  # ends at 2.0, gaps 0.1 x3
        ok(2.0, [0.2, 1.2], e2e=2.0),  # ends at 4.0, gap 1.0
        RequestResult(
            ok=False, prompt_tokens=10, output_tokens=0, start=3.0, e2e=0.1, error="HTTP 500"
        ),
    ]
    s = summarize(results)
    assert run_duration(results) == pytest.approx(4.0)
    assert s.duration_s == pytest.approx(4.0)
    assert (s.completed, s.failed) == (3, 1)
    assert s.output_tokens == 9 and s.input_tokens == 30
    assert s.output_throughput == pytest.approx(9 / 4.0)
    assert s.request_throughput == pytest.approx(3 / 4.0)
    assert s.total_token_throughput == pytest.approx(39 / 4.0)
    assert s.ttft_s.count == 3 and s.ttft_s.p50 == pytest.approx(0.5)
    assert s.itl_s.count == 6
    assert s.itl_s.max == pytest.approx(1.0)
    assert s.itl_s.p50 == pytest.approx(percentile([0.5, 0.5, 0.1, 0.1, 0.1, 1.0], 50))
    tpots = [(2.0 - 1.0) / 2, (1.0 - 0.5) / 3, (2.0 - 0.2) / 1]
    assert s.tpot_s.mean == pytest.approx(sum(tpots) / 3)
    assert s.e2e_s.p50 == pytest.approx(2.0)
    assert s.errors == {"HTTP 500": 1}


def test_summarize_explicit_duration_and_empty():
    s = summarize([ok(0.0, [0.1, 0.2], e2e=0.2)], duration_s=2.0)
    assert s.output_throughput == pytest.approx(1.0)
    empty = summarize([])
    assert empty.completed == 0 and math.isnan(empty.output_throughput)
    assert math.isnan(Distribution.of([]).p99)


def test_summarize_counts_prompt_length_disagreements():
    a = ok(0.0, [0.1], e2e=0.1)
    b = ok(0.0, [0.1], e2e=0.1)
    a.server_prompt_tokens, b.server_prompt_tokens = 10, 11
    assert summarize([a, b]).prompt_length_mismatches == 1
