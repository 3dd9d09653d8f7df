"""Speculative decoding on the shard (shard/speculation.py): verifying proposed tokens gives
every request exactly the tokens, logprobs and alternatives it gets one step at a time.

A schedule is served once without proposals (the reference), then again with proposals built
from the reference: right ones, ones wrong at some position, wholly wrong ones, none, and
proposals up to the request's last reserved slot. Rows advance at their own pace then (each by
its accepted run), so the driver filters each request out once it has its tokens, as the
router does. The mix has greedy, seeded, truncated and penalised rows, alternatives, a
constrained row (its proposals' masks), and a request joining in chunks beside verifying rows.
"""

from __future__ import annotations

import random

import pytest

from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import (
    AbortError,
    BlockPool,
    FakeContext,
    assert_same_tokens,
    chooser_params,
    even_ids_mask,
    run,
)

MAX_NEW = 20


PARAMS = {
    0: chooser_params(),
    1: chooser_params(do_sample=True, temperature=0.8, seed=21),
    2: chooser_params(do_sample=True, top_k=8, top_p=0.9, seed=22),
    3: chooser_params(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3),
    4: chooser_params(do_sample=True, min_p=0.05, typical_p=0.9, seed=5),
    10: chooser_params(do_sample=True, temperature=1.2, seed=9),
    30: chooser_params(do_sample=True, seed=11),
}


@pytest.fixture(scope="module")
def svc(servicer_model_dir):
    # Steps queued ahead off, as the launcher sets them with speculation (a step queued before
    # the router's proposals for it exist answers without them).
    settings = ShardSettings(
        model_id=str(servicer_model_dir),
        uds_path="/unused",
        dtype="float32",
        overlap_schedule="off",
    )
    service = build_service(settings)
    warmup = pb.WarmupRequest(max_batch_total_tokens=4096, max_total_tokens=64)
    run(service.Warmup(warmup, FakeContext()))
    return service


class Driver:
    """Serves the schedule; with `reference`, proposes from it as `propose` says."""

    def __init__(self, svc, reference=None, propose=None) -> None:
        self.svc, self.pool, self.got = svc, BlockPool(80, seed=9), {}
        self.reference, self.propose = reference, propose
        self.prompt_len: dict[int, int] = {}
        self.rng = random.Random(4)
        self.steps = 0
        self.mask = even_ids_mask(svc.runner.model.vocab_size)

    def request(self, rid: int, n: int, **kw) -> pb.Request:
        prompt = [3 + (11 * rid + 7 * j) % 150 for j in range(n)]
        self.prompt_len[rid] = n
        return self.pool.request(rid, prompt, MAX_NEW, parameters=PARAMS[rid], top_n_tokens=2, **kw)

    def _proposals(self, batch: pb.CachedBatch, prompting: set[int]) -> dict[int, pb.Proposal]:
        if self.reference is None:
            return {}
        out = {}
        for rid in batch.request_ids:
            done = len(self.got.get(rid, []))
            if rid in prompting or done == 0:
                continue
            ids = self.propose(self, rid, [t for t, _, _ in self.reference[rid]][done:])
            if ids:
                masks = [self.mask] * len(ids) if rid == 30 else []
                out[rid] = pb.Proposal(ids=ids, token_masks=masks)
        return out

    def record(self, resp) -> pb.CachedBatch:
        self.steps += 1
        for g in resp.generations:
            assert len(g.top_tokens) == len(g.tokens.ids)
            for i, t in enumerate(g.tokens.ids):
                top = list(g.top_tokens[i].ids)
                self.got.setdefault(g.request_id, []).append((t, g.tokens.logprobs[i], top))
        done = [r for r in resp.batch.request_ids if len(self.got.get(r, [])) >= MAX_NEW]
        keep = [r for r in resp.batch.request_ids if r not in done]
        if not done:
            return resp.batch
        if not keep:
            run(self.svc.ClearCache(pb.ClearCacheRequest(id=resp.batch.id), FakeContext()))
            return None
        request = pb.FilterBatchRequest(batch_id=resp.batch.id, request_ids=keep)
        return run(self.svc.FilterBatch(request, FakeContext())).batch

    def masks(self, batch) -> dict[int, bytes]:
        return {30: self.mask} if 30 in batch.request_ids else {}

    def prefill(self, batch_id, requests, cached=None, chunks=None, prompting=()):
        masks = {30: self.mask} if any(r.id == 30 for r in requests) else {}
        proposals = self._proposals(cached, set(prompting)) if cached is not None else {}
        if cached is not None:
            masks.update(self.masks(cached))
        request = pb.PrefillRequest(
            batch=pb.Batch(id=batch_id, requests=requests),
            cached_batches=[cached] if cached is not None else [],
            prefill_chunks=chunks or {},
            token_masks=masks,
            proposals=proposals,
        )
        return self.record(run(self.svc.Prefill(request, FakeContext())))

    def decode(self, batch, prompting=()):
        request = pb.DecodeRequest(
            batches=[batch],
            token_masks=self.masks(batch),
            proposals=self._proposals(batch, set(prompting)),
        )
        return self.record(run(self.svc.Decode(request, FakeContext())))


def _serve(d: Driver) -> dict:
    a = d.prefill(1, [d.request(i, 6 + 3 * i) for i in range(5)])
    a = d.decode(a)
    # Request 10 joins in two chunks beside the decoding (and verifying) rows.
    a = d.prefill(2, [d.request(10, 30)], cached=a, chunks={10: 16}, prompting=[10])
    a = d.decode(a, prompting=[10])  # the rest of its prompt
    c = d.prefill(3, [d.request(30, 7, constrained=True)])
    while a is not None:
        a = d.decode(a)
    while c is not None:
        c = d.decode(c)
    run(d.svc.ClearCache(pb.ClearCacheRequest(), FakeContext()))
    return {rid: toks[:MAX_NEW] for rid, toks in d.got.items()}


def _room(d: Driver, rid: int) -> int:
    """Proposals the request's reserved slots hold: prompt + MAX_NEW - its history length."""
    return MAX_NEW - len(d.got[rid])


def _mixed(d: Driver, rid: int, ahead: list[int]) -> list[int]:
    """Right, wrong at a random place, wholly wrong or none, up to 5 and the slots left."""
    k = min(d.rng.randint(0, 5), _room(d, rid), len(ahead))
    ids = list(ahead[:k])
    kind = d.rng.random()
    if ids and kind < 0.3:
        ids[d.rng.randrange(len(ids))] += 2  # even stays even for the constrained row
    elif ids and kind < 0.45:
        ids = [(i + 4) % 200 for i in ids]
    return ids


def _right_to_the_end(d: Driver, rid: int, ahead: list[int]) -> list[int]:
    return list(ahead[: _room(d, rid)])


@pytest.fixture(scope="module")
def reference(svc):
    return _serve(Driver(svc))


@pytest.mark.parametrize("propose", [_mixed, _right_to_the_end], ids=["mixed", "right"])
def test_verified_proposals_give_the_tokens_of_steps_one_at_a_time(svc, reference, propose):
    assert all(t % 2 == 0 for t, _, _ in reference[30])
    d = Driver(svc, reference, propose)
    assert_same_tokens(_serve(d), reference, atol=1e-4)
    plain = Driver(svc)
    _serve(plain)
    assert d.steps < plain.steps  # accepted runs took fewer steps


def test_wrong_proposals_cost_nothing_but_their_positions(svc, reference):
    def wrong(d, rid, ahead):
        return [(t + 2) % 200 for t in ahead[: min(3, _room(d, rid))]]

    d = Driver(svc, reference, wrong)
    assert_same_tokens(_serve(d), reference, atol=1e-4)


def test_proposals_past_the_reserved_slots_or_for_a_prompt_are_refused(svc):
    d = Driver(svc)
    a = d.prefill(1, [d.request(0, 6)])
    too_many = pb.Proposal(ids=[5] * (MAX_NEW + 1))
    with pytest.raises(AbortError, match="KV slots hold"):
        run(svc.Decode(pb.DecodeRequest(batches=[a], proposals={0: too_many}), FakeContext()))
    b = d.prefill(2, [d.request(1, 40)], chunks={1: 16})
    with pytest.raises(AbortError, match="only verified for a decoding request"):
        run(
            svc.Decode(
                pb.DecodeRequest(batches=[b], proposals={1: pb.Proposal(ids=[5])}), FakeContext()
            )
        )
    run(svc.ClearCache(pb.ClearCacheRequest(), FakeContext()))
