"""Gemma 2, Phi-3, and Gemma 3, Gemma 4 and Llama 4 as released (vision-language, served text
only) end to end: the real launcher with two shards, prefix caching on and a small prefill
budget (prompts chunked across 16-token blocks), serving prompts that share prefixes; greedy ids
and logprobs equal transformers.

Gemma 2's windows (7 tokens) are shorter than every prompt and its soft-caps small enough to
matter; Phi-3's longrope boundary (32 tokens) falls between the short and the long prompts, so
a long prompt must not reuse the blocks a short one computed with the short tables, while two
long prompts share theirs; the short prompt generates past the boundary, where the shards
recompute it with the long tables as transformers does. Chat goes through the checkpoint's
template, which Gemma 3's states in the processor's chat_template.json alone; images are refused.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch
from reference import greedy
from server_process import LauncherProcess

from launcher.tiny_models import VISION_LANGUAGE, build_model
from tests.shard.tiny_model_cases import NEW_ARCH_MODELS, VISION_LANGUAGE_MODELS

pytestmark = pytest.mark.slow
LOGPROB_TOLERANCE = 1e-3
SHARED = "Platform four for the express says "  # 26 tokens: one whole 16-token block
PROMPTS = [
    SHARED + "nine.",  # 30 tokens: under Phi-3's 32-token boundary
    SHARED + "ten, unless the freight train from the north yard is late again today.",  # 72
    # 87, sharing the long prompt's first four blocks
    SHARED + "ten, unless the freight train from the north yard is late again tonight, or "
    "the signals fail.",
    SHARED + "nine.",  # the first again: all but its last token from the cache
]


CASES = {**NEW_ARCH_MODELS, **VISION_LANGUAGE_MODELS}


@pytest.fixture(
    scope="module",
    params=[
        "gemma2_softcap_alternating",
        "phi3_partial_longrope",
        "gemma3_vision_language",
        # per-layer embeddings and KV-sharing layers, whose caches are their sources', under
        # chunked prefill and cached prefixes
        "gemma4_vision_language",
        # attention chunks of 8 positions crossed by every prompt and by the prefill chunks and
        # cached blocks; NoPE layers' position-scaled queries; experts on weighted inputs
        "llama4_vision_language",
    ],
)
def served(request, tmp_path_factory):
    architecture, overrides = CASES[request.param]
    model_dir = build_model(tmp_path_factory.mktemp(request.param), architecture, **overrides)
    if architecture in VISION_LANGUAGE:
        processor_states_the_template(model_dir)
    args = ("--num-shard", "2", "--dtype", "float32", "--prefix-caching",
            "--max-batch-prefill-tokens", "24", "--max-batch-total-tokens", "2048")  # fmt: skip
    env = {"CUDA_VISIBLE_DEVICES": ""} if torch.cuda.device_count() < 2 else None
    with LauncherProcess(model_dir, *args, env=env) as server:
        yield server, model_dir, architecture


def processor_states_the_template(model_dir: Path) -> None:
    """As the Hub's Gemma 3 repos may have it: the chat template in the processor's
    chat_template.json alone, which AutoTokenizer does not read."""
    template = (model_dir / "chat_template.jinja").read_text()
    (model_dir / "chat_template.jinja").unlink()
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (model_dir / "chat_template.json").write_text(json.dumps({"chat_template": template}))


def generate(url: str, prompt: str, n: int) -> tuple[dict, int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": n, "details": True}}
    response = requests.post(f"{url}/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["details"], int(response.headers["x-prompt-cached-tokens"])


def test_two_shards_with_prefix_caching_and_chunks_equal_transformers(served):
    server, model_dir, architecture = served
    cached = []
    for prompt in PROMPTS:  # one at a time: each finds the blocks of those before it
        details, hits = generate(server.url, prompt, 10)
        cached.append(hits)
        ref = greedy(model_dir, prompt, 10)
        assert [t["id"] for t in details["tokens"]] == ref.token_ids, prompt
        for token, expected in zip(details["tokens"], ref.logprobs, strict=True):
            assert token["logprob"] == pytest.approx(expected, abs=LOGPROB_TOLERANCE), prompt
    longrope = architecture == "Phi3ForCausalLM"
    assert cached[0] == 0
    assert cached[2] >= 64  # the two long prompts share their common blocks
    if longrope:
        # The short prompt (30 tokens + 10) crosses the boundary: the shards recompute it with
        # the long tables at position 32, so its blocks are its own (router/prefix_cache.py:
        # may_cross), and a long prompt never reads short-table blocks anyway.
        assert cached[1] == 0 and cached[3] == 0
    else:
        assert cached[1] == 16 and cached[3] >= 16  # the short prompt's block, then all of it
    # and all four at once, batched with chunks interleaved
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: generate(server.url, p, 10)[0], PROMPTS))
    for prompt, details in zip(PROMPTS, results, strict=True):
        assert [t["id"] for t in details["tokens"]] == greedy(model_dir, prompt, 10).token_ids


def test_chat_goes_through_the_checkpoints_template(served):
    server, model_dir, architecture = served
    messages = [{"role": "user", "content": [{"type": "text", "text": PROMPTS[0]}]}]
    body = {"messages": messages, "max_tokens": 6, "logprobs": True, "temperature": 0}
    response = requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    # the template (launcher.tiny_models.CHAT_TEMPLATE) wraps the text in role markers
    prompt = f"<|user|>\n{PROMPTS[0]}<|end|>\n<|assistant|>\n"
    ref = greedy(model_dir, prompt, 6)
    assert [t["logprob"] for t in choice["logprobs"]["content"]] == pytest.approx(
        ref.logprobs[: len(choice["logprobs"]["content"])], abs=LOGPROB_TOLERANCE
    )
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body["messages"] = [{"role": "user", "content": [image, {"type": "text", "text": "Hi"}]}]
    refused = requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert refused.status_code == 422, refused.text  # a validation error, as TGI answers
    assert "image_url" in refused.json()["error"], refused.text
