"""The serving benchmark's fairness rules (issue 13): vLLM-style random-length levels next to
the fixed ones, and the check that fails a run whose server looks starved."""

from __future__ import annotations

import argparse
import random

from bench import serve
from bench.serve_report import level_label
from tests.bench.test_bench_prompts import model_dir  # noqa: F401  (the tokenizer fixture)


def args(**overrides) -> argparse.Namespace:
    a = serve.parse_args([])
    for k, v in overrides.items():
        setattr(a, k, v)
    return a


def test_every_concurrency_level_runs_on_both_datasets_by_default():
    levels = serve.levels_of(args(concurrency=[1, 16]))
    assert [(lv.dataset, lv.value) for lv in levels] == [
        ("fixed", 1), ("fixed", 16), ("random", 1), ("random", 16)
    ]  # fmt: skip
    assert [level_label({"mode": lv.mode, "value": lv.value, "dataset": lv.dataset})
            for lv in levels] == ["c=1", "c=16", "c=1 random", "c=16 random"]  # fmt: skip
    assert level_label({"mode": "concurrency", "value": 8}) == "c=8"  # older results


def test_random_lengths_are_drawn_around_the_means_and_prompts_are_exact(model_dir):  # noqa: F811
    a = args(input_len=40, output_len=20, random_range_ratio=0.5, seed=3)
    workload = serve.Workload(a, model_dir)
    jobs = workload.jobs(0, 24, "random")
    assert all(20 <= j.prompt_tokens <= 60 and 10 <= j.max_tokens <= 30 for j in jobs)
    assert len({j.prompt_tokens for j in jobs}) > 5 and len({j.max_tokens for j in jobs}) > 5
    assert all(workload.factory.count(j.prompt) == j.prompt_tokens for j in jobs)
    again = serve.Workload(a, model_dir).jobs(0, 24, "random")  # the same for every server
    assert [(j.prompt, j.max_tokens) for j in again] == [(j.prompt, j.max_tokens) for j in jobs]
    fixed = workload.jobs(0, 3)
    assert {(j.prompt_tokens, j.max_tokens) for j in fixed} == {(40, 20)}


def test_around_never_goes_below_one():
    rng = random.Random(0)
    assert min(serve.around(rng, 1, 0.9) for _ in range(100)) == 1


def _server(single: float, p50s: list[float]) -> dict:
    levels = [
        {"mode": "concurrency", "value": c, "dataset": "fixed", "summary": {"ttft_s": {"p50": p}}}
        for c, p in zip([1, 16], p50s, strict=True)
    ]
    return {"single_request_ttft_s": single, "levels": levels}


def test_a_starved_server_is_named_with_its_level():
    results = {
        "servers": {
            "switchyard": _server(0.1, [0.1, 0.9]),  # 9x: busy, not starved
            "transformers": _server(0.2, [0.2, 2.5]),  # 12.5x
        }
    }
    (starved,) = serve.starved_levels(results)
    assert starved.startswith("transformers c=16: TTFT p50 2.50 s > 10 x")
