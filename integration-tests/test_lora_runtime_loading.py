"""Runtime LoRA loading through the real launcher: started with no adapter and
--enable-lora-runtime-loading, two PEFT adapters loaded over HTTP are served equal to
transformers + PeftModel (greedy ids); one is unloaded while a long request for it streams (the
request completes, the unload answers after it), and is then an unknown adapter on every route;
a path outside --lora-dir is refused before any shard reads it."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
import requests
from lora_reference import peft_greedy
from server_process import LauncherProcess

from launcher.tiny_models import build_model
from tests.shard.lora_fixtures import ADAPTERS, make_adapter

pytestmark = pytest.mark.slow
NEW_TOKENS = 8
LONG_TOKENS = 300
PROMPTS = ["Hello", "The quick brown fox jumps over the lazy dog."]
API_KEY = "runtime-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
LIMITS = ("--dtype", "float32", "--max-input-tokens", "64", "--max-total-tokens", "400",
          "--max-batch-total-tokens", "2048", "--max-lora-rank", "16",
          "--max-loras", "2")  # fmt: skip


def post(url: str, body: dict, **kwargs) -> requests.Response:
    return requests.post(url, json=body, headers=AUTH, timeout=120, **kwargs)


def generate_ids(url: str, prompt: str, adapter: str | None) -> list[int]:
    params = {"max_new_tokens": NEW_TOKENS, "details": True, "adapter_id": adapter}
    r = post(f"{url}/generate", {"inputs": prompt, "parameters": params})
    assert r.status_code == 200, r.text
    return [t["id"] for t in r.json()["details"]["tokens"]]


def stream_long(url: str, model: str, first_token: threading.Event, out: dict) -> None:
    body = {"model": model, "prompt": PROMPTS[0], "max_tokens": LONG_TOKENS, "stream": True,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    with post(f"{url}/v1/completions", body, stream=True) as r:
        out["status"] = r.status_code
        chunks = []
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                chunks.append(json.loads(line[len(b"data: ") :]))
                first_token.set()
    out["done_at"] = time.monotonic()
    out["finish"] = chunks[-1]["choices"][0]["finish_reason"] if chunks else None


def test_load_serve_unload_while_running(tmp_path):
    base = build_model(tmp_path / "base", "LlamaForCausalLM", num_key_value_heads=2)
    lora_dir = tmp_path / "loras"
    qv = make_adapter(base, lora_dir / "qv", seed=0, **ADAPTERS["qv_r4"])
    allr8 = make_adapter(base, lora_dir / "all", seed=1, **ADAPTERS["all_r8"])
    outside = shutil.copytree(qv, tmp_path / "outside")
    flags = ("--enable-lora-runtime-loading", "--lora-dir", str(lora_dir), "--api-key", API_KEY)
    with LauncherProcess(base, *LIMITS, *flags) as server:
        url = server.url
        models = requests.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert len(models) == 1
        served_name = models[0]["id"]

        load = f"{url}/v1/load_lora_adapter"
        r = requests.post(load, json={"lora_name": "qv", "lora_path": "qv"}, timeout=10)
        assert r.status_code == 401  # the API key guards it
        r = post(load, {"lora_name": "qv", "lora_path": str(outside)})
        assert r.status_code == 400
        assert str(outside) in r.json()["error"] and "--lora-dir" in r.json()["error"]
        r = post(load, {"lora_name": "qv", "lora_path": "qv"})
        assert r.status_code == 200, r.text
        r = post(load, {"lora_name": "all", "lora_path": str(allr8)})
        assert r.status_code == 200, r.text
        names = [m["id"] for m in requests.get(f"{url}/v1/models", timeout=10).json()["data"]]
        assert names == [served_name, "qv", "all"]

        for prompt in PROMPTS:
            for name, path in [(None, None), ("qv", qv), ("all", allr8)]:
                want, _ = peft_greedy(base, path, prompt, NEW_TOKENS)
                assert generate_ids(url, prompt, name) == want, (name, prompt)

        # Unload qv while a long request for it streams.
        first_token, streamed = threading.Event(), {}
        streaming = threading.Thread(target=stream_long, args=(url, "qv", first_token, streamed))
        streaming.start()
        assert first_token.wait(60)
        unload_sent = time.monotonic()
        r = post(f"{url}/v1/unload_lora_adapter", {"lora_name": "qv"})
        streaming.join(60)
        # Had the shards been told while the request ran, they would have refused (its batch
        # still uses the adapter's slot): a 200 here and a whole stream mean the unload waited.
        assert r.status_code == 200, r.text
        assert streamed["status"] == 200 and streamed["finish"] == "length"
        assert unload_sent < streamed["done_at"], "the request ended before the unload: too short"

        r = post(f"{url}/generate", {"inputs": "x", "parameters": {"adapter_id": "qv"}})
        assert r.status_code == 422 and "'qv' is not a loaded LoRA adapter" in r.json()["error"]
        r = post(f"{url}/v1/completions", {"model": "qv", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 404 and "The model `qv` does not exist" in r.json()["error"]
        want, _ = peft_greedy(base, allr8, PROMPTS[1], NEW_TOKENS)
        assert generate_ids(url, PROMPTS[1], "all") == want  # the other one still served
        info = requests.get(f"{url}/info", timeout=10).json()
        assert info["lora_adapters"] == ["all"]
