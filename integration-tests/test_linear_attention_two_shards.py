"""Qwen3.5 (Gated DeltaNet linear attention in every other layer here: a state per sequence)
end to end: the real launcher with two shards (linear attention's key heads split between
them), a small prefill budget so that prompts are computed in chunks beside decoding ones, and
three state slots for five concurrent requests, so that later requests take the slots earlier
ones freed. Greedy ids and logprobs equal transformers; prefix caching is off for the model
without being asked (asking for it is refused: tests/router/test_linear_attention_serving.py)."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from reference import greedy
from server_process import LauncherProcess

from launcher.tiny_models import build_model
from tests.shard.tiny_model_cases import NEW_ARCH_MODELS

pytestmark = pytest.mark.slow
LOGPROB_TOLERANCE = 1e-3
PROMPTS = [
    "Platform four for the express says nine.",
    "Go",
    "Platform four for the express says ten, unless the freight train from the north yard "
    "is late again today.",
    "The signals at the junction",
    "Ten trains wait at the north yard while the express leaves platform four on time.",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    architecture, overrides = NEW_ARCH_MODELS["qwen3_5_linear_attention"]
    return build_model(tmp_path_factory.mktemp("qwen3_5"), architecture, **overrides)


def env() -> dict[str, str] | None:
    return {"CUDA_VISIBLE_DEVICES": ""} if torch.cuda.device_count() < 2 else None


def generate(url: str, prompt: str, n: int) -> dict:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": n, "details": True}}
    response = requests.post(f"{url}/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["details"]


def test_two_shards_concurrent_chunked_requests_equal_transformers(model_dir):
    args = ("--num-shard", "2", "--dtype", "float32", "--max-batch-prefill-tokens", "16",
            "--max-batch-size", "3", "--max-batch-total-tokens", "2048")  # fmt: skip
    with LauncherProcess(model_dir, *args, env=env()) as server:
        info = requests.get(f"{server.url}/info", timeout=30).json()
        assert info["prefix_caching"] is False and info["max_batch_size"] == 3
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            results = list(pool.map(lambda p: generate(server.url, p, 8), PROMPTS))
    for prompt, details in zip(PROMPTS, results, strict=True):
        ref = greedy(model_dir, prompt, 8)
        assert [t["id"] for t in details["tokens"]] == ref.token_ids, prompt
        for token, expected in zip(details["tokens"], ref.logprobs, strict=True):
            assert token["logprob"] == pytest.approx(expected, abs=LOGPROB_TOLERANCE), prompt
