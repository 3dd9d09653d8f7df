"""Prefix caching end to end: the real launcher with caching on and off serves requests that
share prefixes; greedy ids and logprobs equal transformers either way, and only caching reads
prompt tokens from the cache.

The model is the sliding-window Mistral (window 12, shorter than the shared prefixes), served
with a small prefill budget so that prompts are chunked across 16-token blocks too.

With caching on (the router's default) that server is test_generate_vs_transformers.py's Mistral
server, flag for flag: the check runs there (test_shared_prefixes_equal_transformers_with_caching)
rather than on a second server started the same way; this file starts the one with caching off.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from it_cases import TINY_MODELS
from reference import greedy
from server_process import LauncherProcess

pytestmark = pytest.mark.slow
LOGPROB_TOLERANCE = 1e-3
SYSTEM = (
    "System: you are a careful assistant of the switchyard. Answer briefly, cite the timetable, "
    "and never guess a platform number. "
)


@pytest.fixture(scope="module")
def served(tiny_model_dirs):
    model_dir = tiny_model_dirs["mistral"]
    with LauncherProcess(
        model_dir,
        "--dtype", "float32",
        "--max-batch-total-tokens", "4096",
        "--max-batch-prefill-tokens", "24",
        "--no-prefix-caching",
    ) as server:  # fmt: skip
        yield server, model_dir


def generate(server, prompt: str, n: int) -> tuple[dict, int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": n, "details": True}}
    response = requests.post(f"{server.url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json(), int(response.headers["x-prompt-cached-tokens"])


def check(model_dir, prompt: str, out: dict, n: int) -> None:
    ref = greedy(model_dir, prompt, n)
    tokens = out["details"]["tokens"]
    assert [t["id"] for t in tokens] == ref.token_ids, prompt
    for token, expected in zip(tokens, ref.logprobs, strict=True):
        assert token["logprob"] == pytest.approx(expected, abs=LOGPROB_TOLERANCE), prompt


def check_shared_prefixes(server, model_dir, caching: bool) -> None:
    """Prompts sharing prefixes, one after another and at once, equal transformers; with
    caching, later ones read their shared blocks from the cache, without it none do."""
    assert TINY_MODELS["mistral"]["sliding_window"] < len(SYSTEM) // 4
    cached = {}
    # The same system prompt, two questions.
    for q in ("Which platform for the 9:15?", "Is the express late?"):
        out, cached[q] = generate(server, SYSTEM + q, 12)
        check(model_dir, SYSTEM + q, out, 12)
    # A conversation: each turn resends the history, answers included.
    history = SYSTEM + "User: hello."
    for turn in range(3):
        out, cached[f"turn {turn}"] = generate(server, history, 10)
        check(model_dir, history, out, 10)
        history += out["generated_text"] + f" User: and then {turn}?"
    # A prompt that is a prefix of an earlier one, ending mid-block, and one extending it.
    long = SYSTEM + "Platforms: one, two, three, four, five."
    for prompt in (long, long[: len(SYSTEM) + 7], long + " Six."):
        out, cached[prompt] = generate(server, prompt, 8)
        check(model_dir, prompt, out, 8)
    # Identical prompts at once (and one whose prefix they all computed before).
    same = SYSTEM + "Identical question, four times?"
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: generate(server, same, 10), range(4)))
    for out, n in outs:
        check(model_dir, same, out, 10)
        cached[f"same {n}"] = n
    if caching:
        assert cached["Is the express late?"] >= 16 * (len(SYSTEM) // 16 - 1) // 2
        assert cached["turn 1"] > cached["turn 0"] > 0 and cached["turn 2"] > cached["turn 1"]
        assert all(n % 16 == 0 for n in cached.values())
    else:
        assert set(cached.values()) == {0}


def test_shared_prefixes_equal_transformers_without_caching(served):
    server, model_dir = served
    check_shared_prefixes(server, model_dir, caching=False)
