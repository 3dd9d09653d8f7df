"""The whole server with `--attention triton`: greedy token ids equal transformers on a tiny
model. Without a GPU the kernels run in triton's CPU interpreter (TRITON_INTERPRET=1); with one,
compiled on it.

The model has head dim 64 (a supported kernel size) and 4 query heads per KV head, so the
prefill, decode and KV-write kernels all run with GQA; it is a Mistral with a 24-token sliding
window, shorter than the longer prompts plus their generations, so the windowed paths run too.
Prompts and generations cross 16-token blocks, and concurrent requests make decode batches with
ragged contexts.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from it_cases import PROMPTS
from reference import greedy
from server_process import LauncherProcess

from launcher.tiny_models import build_model

pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[dev]' on Linux)")
pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 20
# Interpreted kernels are slow: keep Warmup's worst-case prefill (max_batch_prefill_tokens of
# max_input_tokens prompts) small.
LIMITS = ("--max-input-tokens", "96", "--max-total-tokens", "128",
          "--max-batch-prefill-tokens", "96", "--max-batch-total-tokens", "1024")  # fmt: skip


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory):
    return build_model(
        tmp_path_factory.mktemp("triton") / "mistral-gqa-d64-window24",
        "MistralForCausalLM",
        hidden_size=256,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=1,
        sliding_window=24,
    )


@pytest.fixture(scope="module")
def served(gqa_model):
    args = ("--dtype", "float32", "--attention", "triton", *LIMITS)
    # The interpreter only takes CPU tensors, and a shard with a GPU puts its model there.
    env = None if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"}
    with LauncherProcess(gqa_model, *args, env=env) as server:
        yield server


def generate_ids(server, prompt: str) -> list[int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": MAX_NEW_TOKENS, "details": True}}
    response = requests.post(f"{server.url}/generate", json=body, timeout=600)
    assert response.status_code == 200, response.text
    return [t["id"] for t in response.json()["details"]["tokens"]]


def test_shard_runs_the_triton_backend_interpreted(served):
    assert "with triton attention" in served.log_path.read_text(errors="replace")


def test_greedy_ids_equal_transformers(served, gqa_model):
    prompts = PROMPTS[:3]
    # Concurrent requests: packed multi-sequence prefill and batched paged decode.
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: generate_ids(served, p), prompts))
    for prompt, ids in zip(prompts, results, strict=True):
        assert ids == greedy(gqa_model, prompt, MAX_NEW_TOKENS).token_ids, prompt
