"""Multi-LoRA through the launcher and HTTP: PEFT adapters (made by `peft`) served mixed with
base-model requests in the same batches, against transformers + PeftModel running each adapter
alone (float32): greedy ids equal, logprobs within tolerance. 1 and 2 shards (gloo on CPU),
chunked prefill on (a small prompt budget, so prompts span steps mixed with decoding), through
huggingface_hub's TGI client (`adapter_id`) and the openai client (`model` = the adapter).
A second server, on a Qwen2 base, has fewer slots and host cache entries than adapters in use, so
slots are reused and adapters are read from disk again, and still matches.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests
import torch
from huggingface_hub import InferenceClient
from lora_reference import peft_greedy
from server_process import LauncherProcess

from launcher.tiny_models import build_model
from tests.shard.lora_fixtures import ADAPTERS, make_adapter

pytestmark = pytest.mark.slow
NEW_TOKENS = 8
LOGPROB_TOLERANCE = 1e-3
PROMPTS = ["Hello", "The quick brown fox jumps over the lazy dog.", "日本語 🚀", "Switchyard"]
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""} if torch.cuda.device_count() < 2 else {}
LIMITS = ("--dtype", "float32", "--max-batch-prefill-tokens", "24", "--max-input-tokens", "64",
          "--max-total-tokens", "96", "--max-batch-total-tokens", "2048",
          "--max-lora-rank", "16")  # fmt: skip


def _models(root: Path, architecture: str) -> tuple[Path, dict[str, Path]]:
    base = build_model(root / "base", architecture, num_key_value_heads=2)
    adapters = {
        name: make_adapter(base, root / name, seed=i, **cfg)
        for i, (name, cfg) in enumerate(ADAPTERS.items())
    }
    return base, adapters


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    return _models(tmp_path_factory.mktemp("lora"), "LlamaForCausalLM")


@pytest.fixture(scope="module")
def qwen2_models(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """Qwen2: biases on q/k/v, so the terms add to biased products."""
    return _models(tmp_path_factory.mktemp("lora-qwen2"), "Qwen2ForCausalLM")


def reference(base: Path, adapter: Path | None, prompt: str) -> tuple[list[int], list[float]]:
    return peft_greedy(base, adapter, prompt, NEW_TOKENS)


def tgi(url: str, prompt: str, adapter: str) -> tuple[list[int], list[float], str]:
    client = InferenceClient(base_url=url)
    out = client.text_generation(
        prompt, max_new_tokens=NEW_TOKENS, details=True, adapter_id=adapter or None
    )
    tokens = out.details.tokens
    return [t.id for t in tokens], [t.logprob for t in tokens], out.details.finish_reason


def openai_ids(url: str, prompt: str, model: str) -> list[float]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    out = client.completions.create(
        model=model, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0, logprobs=1,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    return out.choices[0].logprobs.token_logprobs


def serve_mixed(base: Path, adapters: dict[str, Path], *args: str, env=None) -> dict:
    flags = ",".join(f"{n}={p}" for n, p in adapters.items())
    jobs = [(p, a) for p in PROMPTS for a in ["", *adapters]]
    with LauncherProcess(base, *LIMITS, "--lora-adapters", flags, *args, env=env) as server:
        with ThreadPoolExecutor(len(jobs)) as pool:
            got = dict(zip(jobs, pool.map(lambda j: tgi(server.url, *j), jobs), strict=True))
            served_name = requests.get(f"{server.url}/v1/models", timeout=10).json()["data"]
            names = {m["id"] for m in served_name}
            assert set(adapters) <= names and len(names) == len(adapters) + 1
            base_name = next(m["id"] for m in served_name if m["id"] not in adapters)
            chat = {
                (PROMPTS[1], a): openai_ids(server.url, PROMPTS[1], a or base_name)
                for a in ["", *adapters]
            }
        metrics = requests.get(f"{server.url}/metrics", timeout=10).text
        missing = requests.post(
            f"{server.url}/generate",
            json={"inputs": "x", "parameters": {"adapter_id": "nope", "max_new_tokens": 2}},
            timeout=10,
        )
    assert missing.status_code == 422 and "nope" in missing.json()["error"]
    return {"tgi": got, "openai": chat, "metrics": _lora_metrics(metrics)}


def _lora_metrics(text: str) -> dict[str, float]:
    """The shard-side LoRA numbers (and per-adapter request counts) from /metrics."""
    found = {}
    for line in text.splitlines():
        if line.startswith(("switchyard_lora_", "switchyard_adapter_requests_total")):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def check(base: Path, adapters: dict[str, Path], served: dict, what: str) -> None:
    eos = json.loads((base / "generation_config.json").read_text())["eos_token_id"]
    for (prompt, adapter), (ids, logprobs, finish) in served["tgi"].items():
        want_ids, want_lps = reference(base, adapters.get(adapter), prompt)
        if eos in want_ids:  # TGI's /generate stops at EOS, as transformers' generate does
            end = want_ids.index(eos) + 1
            want_ids, want_lps = want_ids[:end], want_lps[:end]
        assert finish == ("eos_token" if want_ids[-1] == eos else "length"), what
        assert ids == want_ids, f"{what}: {adapter or 'base'} on {prompt!r}"
        assert logprobs == pytest.approx(want_lps, abs=LOGPROB_TOLERANCE), what
    for (prompt, adapter), logprobs in served["openai"].items():
        want = reference(base, adapters.get(adapter), prompt)[1]
        assert logprobs == pytest.approx(want, abs=LOGPROB_TOLERANCE), f"{what} openai {adapter}"


def test_adapters_mixed_with_base_on_one_and_two_shards_equal_peft(models):
    base, adapters = models
    with ThreadPoolExecutor(2) as pool:
        one = pool.submit(serve_mixed, base, adapters, "--num-shard", "1")
        two = pool.submit(serve_mixed, base, adapters, "--num-shard", "2", env=CPU_ONLY)
        one, two = one.result(), two.result()
    check(base, adapters, one, "1 shard")
    check(base, adapters, two, "2 shards")


def test_fewer_slots_and_cache_entries_than_adapters_still_equal_peft(qwen2_models):
    base, adapters = qwen2_models
    served = serve_mixed(base, adapters, "--max-loras", "2", "--max-cpu-loras", "2")
    check(base, adapters, served, "--max-loras 2 --max-cpu-loras 2")
    metrics = served["metrics"]
    assert metrics["switchyard_lora_slots_in_use"] == 2
    # Four adapters through a cache of two: some are read from disk again after startup.
    assert metrics["switchyard_lora_host_cache_misses_total"] > len(adapters)
    assert metrics["switchyard_lora_host_cache_evictions_total"] > 2
    for name in adapters:  # TGI requests (one per prompt) and one openai request each
        want = len(PROMPTS) + 1
        assert metrics[f'switchyard_adapter_requests_total{{adapter="{name}"}}'] == want
