"""bench/lora_serve.py's non-timing core, quickly and without a server: the PEFT adapters it
builds (accepted by a shard's LoraManager, non-zero, different per adapter, reused when cached),
how requests are spread over adapters and reach a server under the right name, and the report's
ratios. Timings are not checked."""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from aiohttp import web
from aiohttp.test_utils import TestServer
from safetensors.torch import load_file

from bench.lora_adapters import ALL_MODULES, build_adapters, describe
from bench.lora_serve import adapter_tokens, round_order
from bench.lora_serve_report import ratios, report
from bench.lora_spread import configs, run_concurrency, spread
from bench.serve_client import Endpoint, Job
from launcher.tiny_models import build_model


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    base = build_model(tmp_path_factory.mktemp("base"))  # 2 layers, hidden 64: ~1 s
    return base, build_adapters(base, tmp_path_factory.mktemp("loras"), count=3, rank=4)


def test_adapters_are_distinct_nonzero_peft_dirs_a_shard_accepts(adapters):
    from shard.distributed import Distributed
    from shard.lora.manager import LoraManager, LoraSettings
    from shard.models import load_model

    base, built = adapters
    assert list(built) == ["lora00", "lora01", "lora02"]
    for path in built.values():
        assert describe(path) == {"r": 4, "lora_alpha": 32, "target_modules": sorted(ALL_MODULES)}
    weights = [load_file(p / "adapter_model.safetensors") for p in built.values()]
    b_keys = [k for k in weights[0] if "lora_B" in k]
    # 7 modules x 2 layers, and PEFT's zero B replaced: every adapter changes the model.
    assert len(b_keys) == 14
    assert all(bool(w[k].abs().min() > 0) for w in weights for k in b_keys)
    assert not torch.equal(weights[0][b_keys[0]], weights[1][b_keys[0]])
    # The shard's own loader validates every adapter at construction.
    model = load_model(base, dtype=torch.float32, device=torch.device("cpu"), dist=Distributed())
    manager = LoraManager(model, LoraSettings(adapters=built, max_loras=2))
    assert manager.names == list(built)


def test_a_complete_cached_set_is_reused_not_rebuilt(adapters):
    base, built = adapters
    root = next(iter(built.values())).parent
    stamps = {n: (p / "adapter_model.safetensors").stat().st_mtime_ns for n, p in built.items()}
    again = build_adapters(base, root, count=3, rank=4)
    assert again == built
    assert {n: (p / "adapter_model.safetensors").stat().st_mtime_ns for n, p in again.items()} == (
        stamps
    )


def test_configurations_and_round_robin_spreading():
    names = [f"lora{i:02d}" for i in range(16)]
    plan = configs(names, [1, 4, 16])
    assert [(c.label, c.count) for c in plan] == [
        ("base", 0),
        ("1 adapter", 1),
        ("4 adapters", 4),
        ("16 adapters", 16),
    ]
    with pytest.raises(ValueError, match="17 adapters"):
        configs(names, [17])
    ep = Endpoint("http://x", "openai", "/models/base", {"ignore_eos": True})
    jobs = [Job(f"p{i}", 8, 4) for i in range(10)]
    four = spread(ep, plan[2], jobs)
    assert [e.model for e, _ in four] == [names[i % 4] for i in range(10)]
    # vLLM's benchmark_serving placement: an independent seeded draw per request.
    many = [Job(f"p{i}", 8, 4) for i in range(200)]
    drawn = [e.model for e, _ in spread(ep, plan[2], many, "random", seed=5)]
    assert drawn == [e.model for e, _ in spread(ep, plan[2], many, "random", seed=5)]
    assert drawn != [e.model for e, _ in spread(ep, plan[2], many, "random", seed=6)]
    assert set(drawn) == set(names[:4]) and drawn != [names[i % 4] for i in range(200)]
    with pytest.raises(ValueError, match="placement 'sorted'"):
        spread(ep, plan[2], jobs, "sorted")
    assert [j for _, j in four] == jobs and all(e.extra_body == ep.extra_body for e, _ in four)
    assert {e.model for e, _ in spread(ep, plan[0], jobs)} == {"/models/base"}
    tgi = spread(Endpoint("http://x", "tgi", "m", {}), plan[1], jobs[:1])
    assert tgi[0][0].extra_body == {"adapter_id": "lora00"}
    assert [c.label for c in round_order(plan, 1)] == [c.label for c in reversed(plan)]


def test_every_request_reaches_the_server_under_its_adapter_name():
    seen: list[str] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body["model"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body["max_tokens"]):
            chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def go() -> list:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        server = TestServer(app)
        await server.start_server()
        try:
            ep = Endpoint(str(server.make_url("")).rstrip("/"), "openai", "base-model", {})
            (_, four) = configs(["a", "b", "c", "d"], [4])
            requests = spread(ep, four, [Job("p", 3, 2) for _ in range(8)])
            return await run_concurrency(requests, concurrency=3)
        finally:
            await server.close()

    results = asyncio.run(go())
    assert len(results) == 8 and all(r.ok and r.output_tokens == 2 for r in results)
    assert Counter(seen) == {"a": 2, "b": 2, "c": 2, "d": 2}


def test_server_token_counts_are_read_per_adapter_label():
    samples = {
        ("switchyard_adapter_generated_tokens_total", 'adapter="base"'): 5.0,
        ("switchyard_adapter_generated_tokens_total", 'adapter="lora01"'): 7.0,
        ("switchyard_generated_tokens_total", ""): 12.0,
    }
    assert adapter_tokens(samples) == {"base": 5.0, "lora01": 7.0}
    assert adapter_tokens(None) == {}


def _run(round_: int, label: str, n: int, tok_s: float) -> dict:
    dist = {"p50": 0.1, "p99": 0.2}
    summary = {"output_throughput": tok_s, "completed": 4, "failed": 0, "output_tokens": 64}
    summary |= {"ttft_s": dist, "itl_s": dist}
    return {"round": round_, "config": label, "adapters": n, "summary": summary}


def test_ratios_are_against_the_base_run_of_the_same_round_and_of_the_means():
    results = {
        "meta": {"goals": {"4": 0.8, "16": 0.7}},
        "runs": [
            _run(0, "base", 0, 100.0),
            _run(0, "4 adapters", 4, 90.0),
            _run(0, "16 adapters", 16, 50.0),
            _run(1, "16 adapters", 16, 70.0),
            _run(1, "4 adapters", 4, 60.0),
            _run(1, "base", 0, 80.0),
        ],
    }
    rows = {r["config"]: r for r in ratios(results)}
    assert rows["base"]["ratio"] == 1.0
    assert rows["4 adapters"]["ratio_per_round"] == [0.9, 0.75]
    assert math.isclose(rows["4 adapters"]["ratio"], 75.0 / 90.0)  # 0.83x: goal 0.8 met
    assert math.isclose(rows["16 adapters"]["ratio"], 60.0 / 90.0)  # 0.67x: goal 0.7 missed
    text = report(results, markdown=True)
    assert ">= 0.8x: met" in text and ">= 0.7x: missed" in text
    assert "| 1 | 16 adapters | 4 | 0 | 70.0 |" in text
