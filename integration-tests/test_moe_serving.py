"""Mixture-of-Experts models end to end: the real launcher with two shards, once with the
experts split tensor-parallel (DeepSeek-V3: its shared expert and dense first layer too, and
its latent attention, each shard caching the one latent vector a token that prefix caching
shares) and once
expert-parallel (gpt-oss as released, its experts in MXFP4, `--expert-parallel`: each shard holds
half the experts whole; attention sinks, and a 7-token window in every other layer); prefix
caching on and a small prefill budget (prompts chunked across 16-token blocks). Greedy ids and
logprobs equal transformers, one request at a time and batched together with structured-output
requests (the router's token masks reach both shards)."""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from reference import greedy
from server_process import LauncherProcess

from launcher.tiny_models import build_model
from tests.shard.tiny_model_cases import MOE_MODELS

pytestmark = pytest.mark.slow
LOGPROB_TOLERANCE = 1e-3
SHARED = "Platform four for the express says "  # 26 tokens: one whole 16-token block
PROMPTS = [
    SHARED + "nine.",
    SHARED + "ten, unless the freight train from the north yard is late again today.",
    SHARED + "ten, unless the freight train from the north yard is late again tonight, or "
    "the signals fail.",  # shares the long prompt's first blocks
]
REGEX = r"(ab|cd)[0-9]{2,3}-[a-z]{1,4}"


@pytest.fixture(
    scope="module",
    params=[("deepseek_v3_mla", ()), ("gpt_oss_mxfp4", ("--expert-parallel",))],
    ids=["deepseek_v3-tensor-parallel", "gpt_oss_mxfp4-expert-parallel"],
)
def served(request, tmp_path_factory):
    name, flags = request.param
    architecture, overrides = MOE_MODELS[name]
    model_dir = build_model(tmp_path_factory.mktemp(name), architecture, **overrides)
    args = ("--num-shard", "2", "--dtype", "float32", "--prefix-caching", *flags,
            "--max-batch-prefill-tokens", "24", "--max-batch-total-tokens", "2048")  # fmt: skip
    # Two shards need two GPUs; short of that both run on the CPU with gloo.
    env = {"CUDA_VISIBLE_DEVICES": ""} if torch.cuda.device_count() < 2 else None
    with LauncherProcess(model_dir, *args, env=env) as server:
        yield server, model_dir


def generate(url: str, prompt: str, n: int, **params) -> tuple[dict, int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": n, "details": True, **params}}
    response = requests.post(f"{url}/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text  # a 424: the shards diverged
    return response.json(), int(response.headers["x-prompt-cached-tokens"])


def assert_equals_transformers(model_dir, prompt: str, details: dict) -> None:
    ref = greedy(model_dir, prompt, len(details["tokens"]))
    assert [t["id"] for t in details["tokens"]] == ref.token_ids, prompt
    for token, expected in zip(details["tokens"], ref.logprobs, strict=True):
        assert token["logprob"] == pytest.approx(expected, abs=LOGPROB_TOLERANCE), prompt


def test_prefix_cached_chunked_and_batched_with_structured_output(served):
    server, model_dir = served
    cached = []
    for prompt in PROMPTS:  # one at a time: each finds the blocks of those before it
        body, hits = generate(server.url, prompt, 10)
        cached.append(hits)
        assert_equals_transformers(model_dir, prompt, body["details"])
    assert cached[0] == 0 and cached[1] == 16 and cached[2] >= 64
    # all at once, chunks interleaved, beside two regex-constrained requests (greedy, sampled)
    constrained = [{"grammar": {"type": "regex", "value": REGEX}, "seed": 11}] * 2
    constrained[1] = {**constrained[1], "do_sample": True}
    jobs = [(p, 10, {}) for p in PROMPTS] + [("Hello", 24, c) for c in constrained]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda j: generate(server.url, j[0], j[1], **j[2])[0], jobs))
    for prompt, body in zip(PROMPTS, results, strict=False):
        assert_equals_transformers(model_dir, prompt, body["details"])
    for body in results[len(PROMPTS) :]:
        assert re.fullmatch(REGEX, body["generated_text"]), body["generated_text"]
