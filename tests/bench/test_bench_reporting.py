"""Ratios, tables, /metrics arithmetic and shard batch layout of the benchmarks."""

from __future__ import annotations

import math

import pytest

from bench.serve_metrics import parse_prometheus, shard_time
from bench.serve_report import ratios, report
from bench.serve_stats import RequestResult, summarize
from bench.shard_batches import blocks_per_request, cache_tokens_needed, make_batch


def level(mode: str, value: float, tok_s: float, itl_p99_s: float) -> dict:
    r = RequestResult(True, 10, 11, 0.0, 1.0, 0.1, [0.1 + 0.09 * i for i in range(11)])
    s = summarize([r]).to_dict()
    s["output_throughput"] = tok_s
    s["itl_s"]["p99"] = itl_p99_s
    return {"mode": mode, "value": value, "summary": s}


def test_ratios_are_server_over_baseline_per_shared_level():
    results = {
        "servers": {
            "switchyard": {
                "levels": [level("concurrency", 1, 30.0, 0.05), level("concurrency", 8, 100.0, 0.2)]
            },
            "transformers": {
                "levels": [level("concurrency", 8, 40.0, 0.4), level("rate", 2.0, 1, 1)]
            },
        }
    }
    rows = ratios(results, "switchyard", "transformers")
    assert [r["level"] for r in rows] == ["c=8"]
    assert rows[0]["out tok/s"] == pytest.approx(2.5)
    assert rows[0]["ITL p99 ms"] == pytest.approx(0.5)
    text = report(results, "transformers", markdown=True)
    assert "| switchyard | c=1 |" in text and "2.50x" in text


def test_ratio_with_missing_figure_is_nan():
    a, b = level("concurrency", 1, 10.0, 0.1), level("concurrency", 1, 10.0, 0.1)
    b["summary"]["ttft_s"]["p50"] = None  # written as null when undefined
    rows = ratios({"servers": {"a": {"levels": [a]}, "b": {"levels": [b]}}}, "a", "b")
    assert math.isnan(rows[0]["TTFT p50 ms"])


METRICS_BEFORE = """# HELP tgi_batch_inference_duration Whole step on the shard
tgi_batch_inference_duration_sum{method="decode"} 1.0
tgi_batch_inference_duration_count{method="decode"} 10
tgi_batch_inference_duration_sum{method="prefill"} 0.5
tgi_batch_inference_duration_count{method="prefill"} 1
tgi_batch_forward_duration_sum{method="decode"} 0.9
"""
METRICS_AFTER = """tgi_batch_inference_duration_sum{method="decode"} 9.0
tgi_batch_inference_duration_count{method="decode"} 90
tgi_batch_inference_duration_sum{method="prefill"} 1.5
tgi_batch_inference_duration_count{method="prefill"} 11
tgi_batch_forward_duration_sum{method="decode"} 8.1
tgi_batch_forward_duration_sum{method="prefill"} 0.9
"""


def test_shard_time_from_two_scrapes():
    before, after = parse_prometheus(METRICS_BEFORE), parse_prometheus(METRICS_AFTER)
    assert before[("tgi_batch_inference_duration_count", 'method="decode"')] == 10
    t = shard_time(before, after, wall_s=10.0)
    assert (t.decode_steps, t.prefill_steps) == (80, 10)
    assert t.decode_step_mean_s == pytest.approx(0.1)
    assert t.prefill_step_mean_s == pytest.approx(0.1)
    assert t.shard_busy_s == pytest.approx(9.0)
    assert t.outside_shard_per_step_s == pytest.approx(1.0 / 90)
    assert t.forward_share == pytest.approx((7.2 + 0.9) / 9.0)


def test_shard_batch_layout_matches_the_router_contract():
    bs = 16
    assert blocks_per_request(30, 3, bs) == 3
    batch = make_batch(7, 2, 30, 3, bs, vocab_size=100)
    assert batch.size == 2 and batch.max_blocks == 3 and batch.max_tokens == 66
    first, second = batch.requests
    assert list(first.blocks) == [1, 2, 3] and list(second.blocks) == [4, 5, 6]  # block 0 unused
    assert len(first.slots) == 33
    assert first.slots[0] == 16 and first.slots[17] == 2 * 16 + 1
    assert all(4 <= t < 100 for t in first.input_ids) and len(first.input_ids) == 30
    assert first.stopping_parameters.ignore_eos_token
    assert cache_tokens_needed(2, 30, 3, bs) == (2 * 3 + 1) * bs
