"""The router tests' fake shard (tests/router/fake_shard.py) against the real servicer: the same
script of protobuf calls to both, and every answer compared in everything but the token values
(the fake's next token is last + 1; the real one's comes from a model). If the servicer's
contract changes (which requests get a token in a step, what a cached batch reports, when the
prompt's logprobs come, how many top tokens), this fails until the fake follows, so the router
tests cannot drift from the shard they stand for.

The script covers Warmup, Prefill of a new batch with a prompt cut into chunks, Decode with the
rest of the chunk, a Prefill of a second batch beside the cached first (concatenation), top
tokens and prompt logprobs, a cached prefix (prefix_len), FilterBatch and ClearCache.
"""

from __future__ import annotations

import math

import pytest

from switchyard_pb import generate_pb2 as pb
from tests.router.fake_shard import FakeShard
from tests.shard.servicer_helpers import BLOCK_SIZE, FakeContext, run, start_service

NUM_BLOCKS = 64


def request(rid: int, prompt: list[int], max_new: int, first_block: int, **kw) -> pb.Request:
    """Consecutive blocks from first_block (block 0 stays the router's), a seeded sampler."""
    total = len(prompt) + max_new
    blocks = list(range(first_block, first_block + -(-total // BLOCK_SIZE)))
    return pb.Request(
        id=rid,
        input_ids=prompt,
        blocks=blocks,
        slots=[blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(total)],
        parameters=pb.NextTokenChooserParameters(seed=rid + 1),
        stopping_parameters=pb.StoppingCriteriaParameters(max_new_tokens=max_new),
        **kw,
    )


def batch(batch_id: int, requests: list[pb.Request]) -> pb.Batch:
    return pb.Batch(
        id=batch_id,
        requests=requests,
        size=len(requests),
        max_tokens=sum(len(r.slots) for r in requests),
        max_blocks=max(len(r.blocks) for r in requests),
    )


PROMPT_A = list(range(10, 15))  # 5 tokens: top tokens and prompt logprobs
PROMPT_B = list(range(20, 41))  # 21 tokens: computed in two chunks
PROMPT_C = list(range(50, 53))


def script() -> list[tuple[str, object]]:
    """(RPC name, request) in the order a router could send them."""
    a = request(1, PROMPT_A, 6, 1, top_n_tokens=2, prefill_logprobs=True)
    b = request(2, PROMPT_B, 5, 3)
    c = request(3, PROMPT_C, 5, 6)
    first = batch(10, [a, b])
    cached = pb.CachedBatch(id=10, request_ids=[1, 2], size=2, max_tokens=11 + 26)
    both = pb.CachedBatch(id=10, request_ids=[1, 2, 3], size=3, max_tokens=11 + 26 + 8)
    warm = batch(0, [request(0, list(range(3, 35)), 2, 1)])
    cached_b = request(4, PROMPT_B, 2, 3, prefix_len=16)
    return [
        ("Warmup", pb.WarmupRequest(
            batch=warm, max_input_tokens=32, max_total_tokens=64, max_prefill_tokens=32,
            max_batch_total_tokens=NUM_BLOCKS * BLOCK_SIZE,
        )),
        ("Prefill", pb.PrefillRequest(batch=first, prefill_chunks={2: 16})),
        ("Decode", pb.DecodeRequest(batches=[cached])),
        ("Prefill", pb.PrefillRequest(batch=batch(11, [c]), cached_batches=[cached])),
        ("Decode", pb.DecodeRequest(batches=[both])),
        ("FilterBatch", pb.FilterBatchRequest(batch_id=10, request_ids=[1, 3])),
        ("Decode", pb.DecodeRequest(
            batches=[pb.CachedBatch(id=10, request_ids=[1, 3], size=2, max_tokens=11 + 8)]
        )),
        ("ClearCache", pb.ClearCacheRequest(id=10)),
        # B's prompt again (B itself was filtered out): its first block, full of B's prompt
        # K/V, is a cached prefix.
        ("Prefill", pb.PrefillRequest(batch=batch(12, [cached_b]))),
        ("ClearCache", pb.ClearCacheRequest()),
    ]  # fmt: skip


def shape(message) -> object:
    """A response with every token id and logprob value replaced by what the contract fixes:
    counts, which requests, prompt ids, and a NaN first prompt logprob."""
    if isinstance(message, (pb.PrefillResponse, pb.DecodeResponse)):
        return ("generations", [_generation(g) for g in message.generations], message.batch)
    if isinstance(message, pb.FilterBatchResponse):
        return ("filtered", message.batch)
    if isinstance(message, pb.WarmupResponse):
        return ("warmup", message.num_blocks, message.max_supported_total_tokens)
    return type(message).__name__


def _generation(g: pb.Generation) -> tuple:
    prompt = g.prefill_tokens
    return (
        g.request_id,
        len(g.tokens.ids),
        len(g.tokens.logprobs),
        [(len(t.ids), len(t.logprobs)) for t in g.top_tokens],
        [(len(t.ids), len(t.logprobs)) for t in g.prefill_top_tokens],
        list(prompt.ids),
        len(prompt.logprobs),
        bool(prompt.logprobs) and math.isnan(prompt.logprobs[0]),
    )


async def _play(servicer) -> list[object]:
    context = FakeContext()
    return [shape(await getattr(servicer, name)(req, context)) for name, req in script()]


@pytest.fixture(scope="module")
def real_answers(servicer_model_dir):
    service = start_service(servicer_model_dir)
    assert service.runner.block_size == BLOCK_SIZE
    return run(_play(service))


def test_fake_shard_answers_like_the_real_servicer(real_answers):
    fake = FakeShard(rank=0, urls=["unix:///unused-0"], block_size=BLOCK_SIZE, num_blocks=160)
    fake_answers = run(_play(fake))
    assert fake.violations == []  # the script itself follows the router's rules
    for step, (name, _), real, mine in zip(
        range(len(real_answers)), script(), real_answers, fake_answers, strict=True
    ):
        assert mine == real, f"step {step} ({name}): the fake shard answers differently"


def test_the_script_exercises_what_it_claims(real_answers):
    """Guards the script: chunked prompt (B gets no token in the first step), prompt logprobs,
    their alternatives and top tokens on A's first token, C joining the cached batch, the
    cached prefix."""
    first, second = real_answers[1], real_answers[2]
    assert [g[0] for g in first[1]] == [1]  # B is still in its prompt
    assert first[1][0][3] == [(2, 2)] and first[1][0][5] == PROMPT_A and first[1][0][7]
    # the prompt's alternatives: none at its first position, top_n at each other one
    assert first[1][0][4] == [(0, 0)] + [(2, 2)] * (len(PROMPT_A) - 1)
    assert [g[0] for g in second[1]] == [1, 2]
    assert [g[0] for g in real_answers[3][1]] == [1, 2, 3]
    assert [g[0] for g in real_answers[8][1]] == [4]
