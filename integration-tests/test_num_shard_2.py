"""`--num-shard 2` on CPU (gloo) serves what one shard and transformers compute.

Per model one 2-shard server, and for the speculating model a 1-shard server beside it (a start
costs ~10-20 s on 2 cores, so every check for a model runs against the same servers). The models
cover the partitioned paths: KV heads split across ranks (llama), a single KV head replicated
on both ranks (mistral), and an odd vocabulary padded to an even split, with qkv biases and
tied embeddings (qwen2).

For one model both servers also speculate (n-gram proposals of 3 tokens): every shard
verifies the same proposals and answers the same accepted runs, and greedy ids still equal
transformers' token for token (speculation is exact), with grammars too. Those servers also
take long prompts while other requests decode with proposals: each is computed in several
chunks beside the verifying rows (a small --prefill-chunk-tokens, whatever the device), and
the second shares the first's long prefix, so its shared blocks come from the prefix cache and
only the rest is chunked; every one of those requests' ids equals transformers' too.

Rank agreement is visible from outside: the router compares every shard's tokens at every step
and fails the batch with a 424 on any difference, so each 200 from the 2-shard server is a step
sequence on which both ranks agreed.
"""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import torch
from reference import greedy
from server_process import LauncherProcess, generate_details, metric_value
from transformers import AutoTokenizer

from launcher.tiny_models import build_model

pytestmark = pytest.mark.slow
LOGPROB_TOLERANCE = 1e-3

MODELS = {
    "llama_split_kv": dict(architecture="LlamaForCausalLM", num_key_value_heads=2),
    "mistral_one_kv_head": dict(architecture="MistralForCausalLM", num_key_value_heads=1),
    "qwen2_odd_vocab": dict(
        architecture="Qwen2ForCausalLM",
        num_key_value_heads=2,
        vocab_size=509,
        tie_word_embeddings=True,
    ),
}
# The model whose servers speculate (instead of the 2-shard one queuing steps ahead: the
# launcher refuses both at once).
SPECULATING = "llama_split_kv"
# Different lengths, so the batch shrinks (FilterBatch on both shards) as requests finish.
GREEDY = [("Hello", 12), ("The quick brown fox jumps over the lazy dog.", 20), ("日本語 🚀", 16)]
SEEDED = [
    ("Tensor parallelism", dict(seed=42)),
    ("Tensor parallelism", dict(seed=7, top_k=20, top_p=0.9, temperature=0.8)),
    ("Paged attention", dict(seed=3, typical_p=0.7, repetition_penalty=1.2)),
]
SAMPLED_TOKENS = 16
# Structured output: every shard gets the router's token masks, greedy and sampled.
REGEX = r"(ab|cd)[0-9]{2,3}-[a-z]{1,4}"
CONSTRAINED = [
    ("Hello", 40, {"grammar": {"type": "regex", "value": REGEX}}),
    ("Paged attention", 40, {"grammar": {"type": "regex", "value": REGEX}, "do_sample": True}),
]
# Speculating servers only: long prompts chunked beside decoding rows that verify proposals,
# the second sharing the first's first 274 tokens (17 full blocks of 16) through the prefix
# cache. While DECODING requests decode (each long enough to outlast both prompts' chunks), the
# LONG ones arrive one after the other (the second once the first has its first token, so its
# blocks are cached and named). The prompts are 288 and 408 tokens; with --prefill-chunk-tokens
# PREFILL_CHUNK a step beside decoding rows computes ~1/4 of the pending prompt tokens (at least
# PREFILL_CHUNK tokens, at most 4x that: router/chunking.py), so each takes about 4 steps.
PREFILL_CHUNK = 32
BLOCK_SIZE = 16  # the shards' default --block-size: the prefix cache shares whole blocks
TIMETABLE = "Timetable of the switchyard. " + " ".join(
    f"Train {n} leaves platform {n % 7} at {6 + n % 12}:{(n * 7) % 60:02d}." for n in range(1, 11)
)
NOTES = (
    " Notes: paged attention reads keys and values through a block table, and tensor "
    "parallelism splits every layer across several devices; the quick brown fox jumps over the "
    "lazy dog while the express waits at the signal for the freight train to clear the junction."
)
DECODING = [("Paged attention reads keys", 128), ("Numbers: 0 1 2 3", 128)]
# The long prompts arrive once each DECODING request has this many tokens: by then the tiny
# model's greedy answers mostly repeat themselves, so prompt lookup proposes (and is often
# right) in most steps.
LOOPING = 24
LONG = [(TIMETABLE + " Which train is late?", 12), (TIMETABLE + NOTES, 12)]


@dataclass
class LongPrompts:
    decoding: list[list[int]]  # token ids of each DECODING request
    long: list[list[int]]  # token ids of each LONG request
    cached: int  # the second LONG request's x-prompt-cached-tokens
    cached_counter: float  # switchyard_prompt_tokens_cached_total's growth over these requests
    steps: list[dict]  # the router's /debug/steps records of these requests' steps


@dataclass
class Served:
    greedy: list[dict]  # details of each GREEDY request
    seeded: list[list[int]]  # token ids of each SEEDED request, first round
    seeded_again: list[list[int]]  # the same requests, sent again
    constrained: list[dict]  # details of each CONSTRAINED request
    log: str
    metrics: str  # the router's /metrics after the requests
    long_prompts: LongPrompts | None = None  # speculating servers only


def concurrently(url: str, jobs: list[tuple[str, int, dict]]) -> list[dict]:
    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(lambda job: generate_details(url, job[0], job[1], **job[2]), jobs))


def ids(details: dict) -> list[int]:
    return [t["id"] for t in details["tokens"]]


def stream_ids(
    url: str, prompt: str, max_new_tokens: int, started: threading.Event, after: int = 1
) -> list[int]:
    """A greedy request over /generate_stream: its token ids; `started` is set once it has
    `after` of them."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens}}
    got = []
    try:
        with requests.post(
            f"{url}/generate_stream", json=body, stream=True, timeout=120
        ) as response:
            assert response.status_code == 200, response.text
            for line in response.iter_lines():
                if line.startswith(b"data:"):
                    event = json.loads(line[len(b"data:") :])
                    assert "token" in event, event  # an error event otherwise
                    got.append(event["token"]["id"])
                    if len(got) >= after:
                        started.set()
    finally:
        started.set()  # ended early or failed: the waiter goes on, and result() says why
    return got


def serve_long_prompts(url: str) -> LongPrompts:
    """DECODING requests streaming, and LONG ones arriving while they decode (module comment)."""

    def counter() -> float:
        return metric_value(
            requests.get(f"{url}/metrics", timeout=30).text, "switchyard_prompt_tokens_cached"
        )

    since = requests.get(f"{url}/debug/steps", timeout=30).json()["next"]
    cached_before = counter()
    with ThreadPoolExecutor(len(DECODING) + 1) as pool:
        started = [threading.Event() for _ in DECODING]
        decoding = [
            pool.submit(stream_ids, url, prompt, n, ready, LOOPING)
            for (prompt, n), ready in zip(DECODING, started, strict=True)
        ]
        assert all(ready.wait(60) for ready in started), "the decoding requests never started"
        first_long = threading.Event()
        long_first = pool.submit(stream_ids, url, *LONG[0], first_long)
        assert first_long.wait(60), "the first long prompt got no token"
        prompt, n = LONG[1]
        body = {"inputs": prompt, "parameters": {"max_new_tokens": n, "details": True}}
        response = requests.post(f"{url}/generate", json=body, timeout=120)
        assert response.status_code == 200, response.text
        long_second = ids(response.json()["details"])
        cached = int(response.headers["x-prompt-cached-tokens"])
        done = [d.result() for d in decoding]
        long_ids = [long_first.result(), long_second]
    steps = requests.get(f"{url}/debug/steps", params={"since": since}, timeout=30).json()
    return LongPrompts(done, long_ids, cached, counter() - cached_before, steps["steps"])


def serve(model_dir: Path, num_shard: int, speculate: bool = False) -> Served:
    args = ("--num-shard", str(num_shard), "--dtype", "float32")
    if speculate:  # short n-grams, so the tiny model's short answers find matches
        config = (  # and at any batch size (the default stops at 8 decoding requests)
            '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, '
            '"disable_by_batch_size": null}'
        )
        args += ("--speculative-config", config, "--prefill-chunk-tokens", str(PREFILL_CHUNK))
    elif num_shard > 1:
        # The two shards also queue each decode step ahead (shard/steps_ahead.py, a GPU's
        # default): the ids must still be one shard's without it, rank 0's broadcast included.
        args += ("--overlap-schedule", "on")
    # Two shards need two GPUs (the launcher refuses fewer); short of that, both servers run
    # on the CPU with gloo, which is the path this file is about, also on a one-GPU machine.
    env = {"CUDA_VISIBLE_DEVICES": ""} if torch.cuda.device_count() < 2 else None
    with LauncherProcess(model_dir, *args, "--max-batch-total-tokens", "2048", env=env) as server:
        greedy_jobs = [(p, n, {"decoder_input_details": True}) for p, n in GREEDY]
        sampled = {"do_sample": True}
        seeded_jobs = [(p, SAMPLED_TOKENS, {**sampled, **params}) for p, params in SEEDED]
        # Unseeded sampling too: the router draws a seed and sends it to every shard alike.
        unseeded = [("Hello", SAMPLED_TOKENS, sampled)] * 2
        constrained = [(p, n, {**params, "seed": 11}) for p, n, params in CONSTRAINED]
        results = concurrently(server.url, greedy_jobs + seeded_jobs + unseeded + constrained)
        again = concurrently(server.url, seeded_jobs)
        long_prompts = serve_long_prompts(server.url) if speculate else None
        return Served(
            greedy=results[: len(GREEDY)],
            seeded=[ids(d) for d in results[len(GREEDY) : len(GREEDY) + len(SEEDED)]],
            seeded_again=[ids(d) for d in again],
            constrained=results[-len(CONSTRAINED) :],
            log=server.log_path.read_text(errors="replace"),
            metrics=requests.get(f"{server.url}/metrics", timeout=30).text,
            long_prompts=long_prompts,
        )


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tp-models")
    return {name: build_model(root / name, **kw) for name, kw in MODELS.items()}


def assert_logprobs_close(got: list[dict], want: list[float], what: str) -> None:
    for step, (token, expected) in enumerate(zip(got, want, strict=True)):
        assert token["logprob"] == pytest.approx(expected, abs=LOGPROB_TOLERANCE), f"{what} {step}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_two_shards_equal_one_shard_and_transformers(model_dirs, name):
    model_dir = model_dirs[name]
    speculate = name == SPECULATING
    # Both servers and the reference at once: starting a server is mostly waiting on imports.
    # The 1-shard server runs beside the speculating model's only: the other models' ids and
    # logprobs are compared with transformers, and one shard's sampling with two shards' is the
    # same code whatever the model (tests/shard/test_tensor_parallel.py checks each model's
    # ranks sample alike from logits equal to one rank's).
    with ThreadPoolExecutor(2) as pool:
        two_shards = pool.submit(serve, model_dir, 2, speculate)
        one_shard = pool.submit(serve, model_dir, 1, speculate) if speculate else None
        refs = [greedy(model_dir, prompt, max_new) for prompt, max_new in GREEDY]
        long_refs = [greedy(model_dir, p, n).token_ids for p, n in DECODING + LONG if speculate]
        two = two_shards.result()
        one = one_shard.result() if one_shard is not None else None
    assert "all 2 shard(s) ready" in two.log
    if one is not None:  # proposals were verified, and some accepted, on both servers
        for served in (two, one):
            assert metric_value(served.metrics, "switchyard_spec_decode_num_accepted_tokens") > 0
            check_long_prompts(served.long_prompts, long_refs, model_dir)
    else:
        assert two.log.count("overlap scheduling: each decode step's successor") == 2  # ranks

    for i, ((prompt, _), ref, got) in enumerate(zip(GREEDY, refs, two.greedy, strict=True)):
        assert ids(got) == ref.token_ids, f"{prompt!r}: 2 shards differ from transformers"
        assert_logprobs_close(got["tokens"], ref.logprobs, f"{prompt!r} vs transformers, step")
        prefill = got["prefill"]
        assert [t["id"] for t in prefill] == ref.prompt_ids
        assert_logprobs_close(prefill[1:], ref.prompt_logprobs, f"{prompt!r} prompt token")
        if one is not None:
            single = one.greedy[i]
            assert ids(single) == ids(got), f"{prompt!r}: 2 shards differ from 1 shard"
            assert_logprobs_close(
                got["tokens"], [t["logprob"] for t in single["tokens"]], f"{prompt!r} vs 1 shard"
            )

    # Seeded sampling repeats itself run after run, on one shard and on two.
    assert two.seeded == two.seeded_again
    assert all(len(t) == SAMPLED_TOKENS for t in two.seeded)
    assert two.seeded[0] != two.seeded[1]  # same prompt, other seed: really sampled

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for got in two.constrained:
        assert got["finish_reason"] == "eos_token"
        assert re.fullmatch(REGEX, tokenizer.decode(ids(got), skip_special_tokens=True))
    if one is not None:
        assert one.seeded == one.seeded_again
        for got, single in zip(two.constrained, one.constrained, strict=True):
            assert ids(got) == ids(single), "constrained: 2 shards differ from 1 shard"


def check_long_prompts(served: LongPrompts | None, refs: list[list[int]], model_dir: Path) -> None:
    """Long prompts chunked beside verifying rows, one through the prefix cache: the ids of
    every request equal transformers', and the steps were what this is about."""
    assert served is not None
    for (prompt, _), got, ref in zip(
        DECODING + LONG, served.decoding + served.long, refs, strict=True
    ):
        assert got == ref, f"{prompt[:40]!r}...: differs from transformers"

    # The second long prompt read the first's full shared blocks from the prefix cache.
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    first, second = (tokenizer(prompt).input_ids for prompt, _ in LONG)
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert served.cached == shared // BLOCK_SIZE * BLOCK_SIZE > 0, (served.cached, shared)
    assert served.cached_counter >= served.cached

    # Both long prompts were computed (their uncached tokens, all of them) in steps beside the
    # decoding requests, in chunks (at least two each, none a whole prompt), and in several of
    # those steps the decoding rows verified proposals, some of them accepted.
    beside = [s for s in served.steps if s["prefill_tokens"] and s["decode_rows"] >= len(DECODING)]
    computed = len(first) + len(second) - served.cached
    assert sum(s["prefill_tokens"] for s in beside) == computed, served.steps
    assert len(beside) >= 2 * len(LONG), beside
    assert max(s["prefill_tokens"] for s in beside) < len(second) - served.cached, beside
    verifying = [s for s in beside if s["proposed_tokens"]]
    assert len(verifying) >= 2, beside
    assert sum(s["accepted_tokens"] for s in verifying) > 0, beside
