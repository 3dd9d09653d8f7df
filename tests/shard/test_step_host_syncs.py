"""A step is queued on the device without the host waiting for it: from its start to the one copy
of its sampled tokens back (shard/runner.py: ModelRunner._launch), nothing reads the device.

On a CPU, `HostSyncGuard` (tests/host_sync_guard.py) fails on each operation that would read a
GPU from the host, with the platform's shapes held static as on CUDA (`static_shapes`) and the
model's forward pass exempt (its attention there is the CPU backend's concern; on a GPU the
graph or the Triton kernels hold it). With a CUDA device, torch's own sync debug mode watches
the whole launch, forward pass included, eager and replayed from CUDA graphs.

The schedule has every kind of row a decode step can hold: greedy, seeded temperature,
top-k/top-p/min-p/typical-p, penalties, a logit bias, alternatives (top_n_tokens), a filter
between steps, a request joining (a mixed step where only some rows sample), rows verifying
proposed tokens (speculative decoding), and the ids it
gives are those of the same schedule served without the guard and with the CPU's own shortcuts.
"""

from __future__ import annotations

import pytest
import torch

import shard.runner
from shard.platforms import platform_of
from shard.platforms.cuda.graphs import DecodeGraphs, EagerReplayer
from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2 as pb
from tests.host_sync_guard import CudaSyncGuard, HostSyncError, HostSyncGuard, guard_launches
from tests.shard.servicer_helpers import BlockPool, FakeContext, assert_same_tokens, run

CUDA = torch.cuda.is_available()
NO_CUDA = "torch.cuda.set_sync_debug_mode watches CUDA's synchronisations: it needs a CUDA device"
MAX_TOTAL_TOKENS = 96


def _params(**kw) -> pb.NextTokenChooserParameters:
    base = dict(temperature=1.0, top_p=1.0, typical_p=1.0, repetition_penalty=1.0, seed=7)
    return pb.NextTokenChooserParameters(**{**base, **kw})


# Every kind of row: (parameters, top_n_tokens)
ROWS = [
    (_params(), 0),  # greedy
    (_params(do_sample=True, temperature=0.7, seed=11), 2),
    (_params(do_sample=True, top_k=5, top_p=0.9, seed=12), 0),
    (_params(do_sample=True, min_p=0.05, typical_p=0.95, seed=13), 3),
    (_params(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2), 0),
    (_params(do_sample=True, seed=14, logit_bias={5: 3.0, 9: -2.0}), 1),
]


def _service(model_dir, graphs: str, overlap: str = "off"):
    """A warmed float32 servicer; graphs "eager" (EagerReplayer), "cuda" or "off"; overlap
    "on" queues steps ahead (shard/steps_ahead.py), whose launches are then guarded too."""
    svc = build_service(
        ShardSettings(
            model_id=str(model_dir),
            uds_path="/unused",
            dtype="float32",
            cuda_graphs=(1, 2, 4, 8) if graphs == "cuda" else (),
            overlap_schedule=overlap,
        )
    )
    runner = svc.runner
    runner.decode_path = None  # the CPU decode loop is the CPU's own path
    if graphs == "eager":
        runner.graphs = DecodeGraphs(
            runner.model, (1, 2, 4, 8), runner.device, None, EagerReplayer()
        )
    warmup = pb.WarmupRequest(max_batch_total_tokens=4096, max_total_tokens=MAX_TOTAL_TOKENS)
    run(svc.Warmup(warmup, FakeContext()))
    return svc


def _serve(svc, speculate: bool = True) -> dict[int, list[tuple[int, float, list[int]]]]:
    """The rows above prefilled and decoded, one dropped, one more joining in chunks, two of
    them with their prompt's logprobs: each request's (id, logprob, top ids) per token, and
    (-prompt length, the prompt logprobs' sum, the prompt ids) for a prompt's logprobs. With
    `speculate`, two last steps verify proposed tokens (a step queued ahead answers without
    them: the launcher never runs speculation with overlap)."""
    pool = BlockPool(64, seed=5)
    got: dict[int, list[tuple[int, float, list[int]]]] = {}

    def request(rid: int, prompt: list[int], params, top_n: int) -> pb.Request:
        return pool.request(
            rid, prompt, MAX_TOTAL_TOKENS - len(prompt), parameters=params, top_n_tokens=top_n,
            prefill_logprobs=rid in (3, 9),
        )  # fmt: skip

    def record(resp) -> pb.CachedBatch:
        for g in resp.generations:
            if g.prefill_tokens.ids:
                ids, lps = list(g.prefill_tokens.ids), list(g.prefill_tokens.logprobs)
                got.setdefault(g.request_id, []).append((-len(ids), sum(lps[1:]), ids))
            for i, (token, logprob) in enumerate(zip(g.tokens.ids, g.tokens.logprobs, strict=True)):
                top = list(g.top_tokens[i].ids) if g.top_tokens else []
                got.setdefault(g.request_id, []).append((token, logprob, top))
        return resp.batch

    prompts = [[3 + (7 * i + 5 * j) % 200 for j in range(9 + 3 * i)] for i in range(len(ROWS))]
    first = [request(i, p, *ROWS[i]) for i, p in enumerate(prompts)]
    batch = record(run(svc.Prefill(pb.PrefillRequest(batch=pb.Batch(id=1, requests=first)),
                                   FakeContext())))  # fmt: skip
    for _ in range(3):
        batch = record(run(svc.Decode(pb.DecodeRequest(batches=[batch]), FakeContext())))
    keep = pb.FilterBatchRequest(batch_id=batch.id, request_ids=[0, 1, 3, 4, 5])
    batch = run(svc.FilterBatch(keep, FakeContext())).batch
    # A request joining in two chunks: mixed steps where the new row does not sample yet.
    late = request(9, [4 + j % 50 for j in range(30)], *ROWS[3])
    joined = pb.PrefillRequest(
        batch=pb.Batch(id=2, requests=[late]), cached_batches=[batch], prefill_chunks={9: 16}
    )
    batch = record(run(svc.Prefill(joined, FakeContext())))
    for _ in range(4):
        batch = record(run(svc.Decode(pb.DecodeRequest(batches=[batch]), FakeContext())))
    # Speculative decoding: rows verifying proposed tokens (shard/speculation.py).
    for proposed in ([5, 6, 7], [8]) if speculate else ():
        proposals = {0: pb.Proposal(ids=proposed), 4: pb.Proposal(ids=proposed[:2])}
        step = pb.DecodeRequest(batches=[batch], proposals=proposals)
        batch = record(run(svc.Decode(step, FakeContext())))
    run(svc.ClearCache(pb.ClearCacheRequest(), FakeContext()))
    return got


@pytest.mark.parametrize("graphs", ["off", "eager"])
def test_a_launch_reads_nothing_of_the_device(servicer_model_dir, graphs, monkeypatch):
    want = _serve(_service(servicer_model_dir, graphs))
    monkeypatch.setattr(platform_of(torch.device("cpu")), "static_shapes", True)
    svc = _service(servicer_model_dir, graphs)
    guards = guard_launches(svc.runner, HostSyncGuard, exempt_forward=True)
    assert_same_tokens(_serve(svc), want)
    assert len(guards) == 2 + 3 + 4 + 2  # every step ran under the guard
    if graphs == "eager":
        assert svc.runner.graphs.graphs  # and decode steps replayed graphs


def test_the_guard_catches_a_read_in_a_launch(servicer_model_dir, monkeypatch):
    svc = _service(servicer_model_dir, "off")
    monkeypatch.setattr(platform_of(torch.device("cpu")), "static_shapes", True)
    sample = shard.runner.sample

    def reads_the_device(logits, *args):
        logits.argmax(-1).tolist()
        return sample(logits, *args)

    monkeypatch.setattr(shard.runner, "sample", reads_the_device)
    guard_launches(svc.runner, HostSyncGuard, exempt_forward=True)
    with pytest.raises(HostSyncError, match="Tensor.tolist"):
        svc.runner._launch(*_one_launch(svc))


def _one_launch(svc):
    """The arguments of the first launch of a one-request batch (planned as step() does)."""
    from shard import prompt_logprobs, wire
    from shard.step_inputs import build_step_inputs, step_lengths

    pool = BlockPool(40, seed=6)
    batch, _ = wire.new_batch(
        pb.Batch(id=5, requests=[pool.request(0, [3, 4, 5, 6], 4)]), svc.runner.device
    )
    inputs = build_step_inputs(batch, step_lengths(batch, {}), device=svc.runner.device)
    return (
        batch,
        inputs,
        None,
        prompt_logprobs.plan(batch, inputs.host, svc.runner.device),
        batch.sampling,
    )


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
@pytest.mark.parametrize("overlap", ["off", "on"])
@pytest.mark.parametrize("graphs", ["off", "cuda"])
def test_no_cuda_synchronisation_in_a_launch(servicer_model_dir, graphs, overlap):
    speculate = overlap == "off"
    want = _serve(_service(servicer_model_dir, graphs), speculate)
    svc = _service(servicer_model_dir, graphs, overlap)

    guards = guard_launches(svc.runner, CudaSyncGuard)
    assert_same_tokens(_serve(svc, speculate), want)
    if overlap == "off":
        assert len(guards) == 2 + 3 + 4 + 2
    else:  # and the steps queued ahead, each decode step's successor
        assert len(guards) > 2 + 3 + 4 and svc.ahead.taken > 0
