"""Overlap scheduling (shard/steps_ahead.py): a decode step queued before the router asks for it
gives the answers the step run on request gives, whatever RPC comes next.

The same schedule is served by a servicer without overlap and by one with it (forced on: a CPU's
default is off), and every token id, logprob and alternative must be equal. The schedule has
each RPC that can follow a step queued ahead: Decode of that batch, Decode of it with another
batch, Prefill with it as the cached batch (a request joining, in chunks), FilterBatch (a
request stopped: its token from the step ahead is never read), ClearCache of a batch with a
step ahead, and a constrained request, whose batch never runs ahead (its mask comes from the
router).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from shard.faults import Faults
from shard.platforms.cuda.graphs import DecodeGraphs, EagerReplayer
from shard.sampling.graph_heads import SamplingHeads
from shard.settings import ShardSettings
from shard.startup import build_service
from shard.steps_ahead import can_run_ahead, overlap_enabled
from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import (
    AbortError,
    BlockPool,
    FakeContext,
    assert_same_tokens,
    chooser_params,
    run,
)

MAX_NEW = 24


PARAMS = [
    chooser_params(),
    chooser_params(do_sample=True, temperature=0.8, seed=21),
    chooser_params(do_sample=True, top_k=8, top_p=0.9, seed=22),
    chooser_params(repetition_penalty=1.2, presence_penalty=0.3),
]


def _service(model_dir, overlap: str, graphs: bool = False):
    """A warmed servicer; with `graphs`, decode graphs ending in the sampling heads, replayed by
    the CPU's stand-in (EagerReplayer), in one bucket: every decode step replays the graph the
    last one did, so a step queued ahead must have its answers out of the graph's outputs
    before another batch's step replays it (on a GPU, too, the graph's outputs are fixed
    buffers)."""
    settings = ShardSettings(
        model_id=str(model_dir), uds_path="/unused", dtype="float32", overlap_schedule=overlap
    )
    svc = build_service(settings)
    if graphs:
        runner = svc.runner
        heads = SamplingHeads(runner.model, runner.block_size)
        runner.graphs = DecodeGraphs(
            runner.model, (8,), runner.device, None, EagerReplayer(), heads=heads
        )
    warmup = pb.WarmupRequest(max_batch_total_tokens=4096, max_total_tokens=64)
    run(svc.Warmup(warmup, FakeContext()))
    return svc


class Schedule:
    """Drives a servicer and records each request's (id, logprob, top ids) per token."""

    def __init__(self, svc) -> None:
        self.svc, self.pool, self.got = svc, BlockPool(60, seed=9), {}

    def request(self, rid: int, n: int, params, **kw) -> pb.Request:
        prompt = [3 + (11 * rid + 7 * j) % 150 for j in range(n)]
        return self.pool.request(rid, prompt, MAX_NEW, parameters=params, top_n_tokens=2, **kw)

    def record(self, resp) -> pb.CachedBatch:
        for g in resp.generations:
            top = list(g.top_tokens[0].ids) if g.top_tokens else []
            self.got.setdefault(g.request_id, []).append(
                (g.tokens.ids[0], g.tokens.logprobs[0], top)
            )
        return resp.batch

    def prefill(self, batch_id, requests, cached=(), chunks=None, masks=None) -> pb.CachedBatch:
        request = pb.PrefillRequest(
            batch=pb.Batch(id=batch_id, requests=requests),
            cached_batches=list(cached),
            prefill_chunks=chunks or {},
            token_masks=masks or {},
        )
        return self.record(run(self.svc.Prefill(request, FakeContext())))

    def decode(self, *batches, masks=None) -> pb.CachedBatch:
        request = pb.DecodeRequest(batches=list(batches), token_masks=masks or {})
        return self.record(run(self.svc.Decode(request, FakeContext())))

    def filter(self, batch: pb.CachedBatch, keep: list[int]) -> pb.CachedBatch:
        request = pb.FilterBatchRequest(batch_id=batch.id, request_ids=keep)
        return run(self.svc.FilterBatch(request, FakeContext())).batch


def _serve(svc) -> dict:
    s = Schedule(svc)
    a = s.prefill(1, [s.request(i, 8 + 3 * i, PARAMS[i]) for i in range(4)])
    for _ in range(3):
        a = s.decode(a)
    a = s.filter(s.decode(a), [0, 2, 3])  # request 1 stopped
    a = s.decode(a)
    # Request 10 joins in two chunks beside a (its step ahead answers for a's rows).
    a = s.prefill(2, [s.request(10, 30, PARAMS[2])], cached=[a], chunks={10: 16})
    a = s.decode(a)  # 10 finishes its prompt: a mixed step
    for _ in range(2):
        a = s.decode(a)
    # A second batch, then both in one Decode (one has a step ahead, one may not).
    # (b truncates, as a does: with graphs, both batches' steps replay the same graph.)
    b = s.prefill(3, [s.request(20, 12, PARAMS[2]), s.request(21, 5, PARAMS[3])])
    ab = s.decode(a, b)
    for _ in range(2):
        ab = s.decode(ab)
    ab = s.filter(ab, [2, 10, 21])
    ab = s.decode(ab)
    # A constrained request (a grammar allowing even ids) steps with its mask each time.
    vocab = svc.runner.model.vocab_size
    mask = bytes(0x55 for _ in range(-(-vocab // 32) * 4))
    c = s.prefill(4, [s.request(30, 6, PARAMS[1], constrained=True)], masks={30: mask})
    for _ in range(3):
        c = s.decode(c, masks={30: mask})
    assert all(t % 2 == 0 for t, _, _ in s.got[30])
    run(svc.ClearCache(pb.ClearCacheRequest(id=ab.id), FakeContext()))  # with its step ahead
    run(svc.ClearCache(pb.ClearCacheRequest(), FakeContext()))
    return s.got


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-heads"])
def test_steps_ahead_give_the_answers_steps_on_request_give(servicer_model_dir, graphs):
    want = _serve(_service(servicer_model_dir, "off", graphs))
    svc = _service(servicer_model_dir, "on", graphs)
    assert_same_tokens(_serve(svc), want)
    # Every Decode of a batch whose rows all decode, and the join, answered from a step ahead.
    assert svc.ahead.taken >= 12
    assert not svc.ahead.steps  # ClearCache dropped the last ones


def test_a_constrained_or_prompt_row_keeps_its_batch_from_running_ahead(servicer_model_dir):
    svc = _service(servicer_model_dir, "on")
    s = Schedule(svc)
    c = s.prefill(1, [s.request(0, 6, PARAMS[0], constrained=True)], masks={0: b"\xff" * 4096})
    assert not svc.ahead.has(c.id) and not can_run_ahead(svc.cache[c.id])
    p = s.prefill(2, [s.request(1, 40, PARAMS[0])], chunks={1: 16})  # still in its prompt
    assert not svc.ahead.has(p.id)
    p = s.decode(p)  # the rest of the prompt: now it decodes
    assert svc.ahead.has(p.id)


def test_a_failure_while_running_ahead_fails_the_step_that_reads_it(servicer_model_dir):
    svc = _service(servicer_model_dir, "on")
    svc.runner.faults = Faults(fail_forward=2)  # the prefill's forward, then the one ahead
    s = Schedule(svc)
    a = s.prefill(1, [s.request(0, 6, PARAMS[0])])  # answered; its next step fails ahead
    assert len(s.got[0]) == 1
    with pytest.raises(AbortError, match="InjectedFault"):
        s.decode(a)


def test_overlap_is_the_platforms_choice_unless_set():
    cpu = torch.device("cpu")
    settings = ShardSettings(model_id="m", uds_path="/u")
    assert not overlap_enabled(settings, cpu)  # on a CPU the host is the device
    assert overlap_enabled(dataclasses.replace(settings, overlap_schedule="on"), cpu)
    assert not overlap_enabled(dataclasses.replace(settings, overlap_schedule="off"), cpu)
