"""Greedy decode steps replayed with their logits and sampling inside the graph
(shard/platforms/cuda/graphs.py's `head`, shard/runner.py's `greedy_head`) give the tokens and
logprobs of the eager sampler; steps that ask more of the sampler (a sampled row, alternatives,
a penalty) replay the forward pass alone and sample eagerly, as before.

On a CPU the graphs are `EagerReplayer`'s (the captured function run again on the same static
buffers); the real CUDA graphs run in tests/shard/test_cuda_graphs.py and
tests/shard/test_step_host_syncs.py on a GPU, where startup gives every decode graph its head.
"""

from __future__ import annotations

import pytest
import torch

from shard.platforms.cuda.graphs import DecodeGraphs, EagerReplayer
from shard.runner import greedy_head
from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import BlockPool, FakeContext, run

BUCKETS = (1, 2, 4)


def _service(model_dir, graphs: bool):
    svc = build_service(
        ShardSettings(
            model_id=str(model_dir), uds_path="/unused", dtype="float32", overlap_schedule="off"
        )
    )
    runner = svc.runner
    runner.decode_path = None  # compare the graphs with the generic eager forward pass
    if graphs:
        model = runner.model
        runner.graphs = DecodeGraphs(
            model, BUCKETS, runner.device, None, EagerReplayer(), head=greedy_head(model)
        )
        runner.graphs.heads = 0
        replay = runner.graphs.replay

        def counted(*args, head=False):
            out = replay(*args, head=head)
            runner.graphs.heads += head and out is not None
            return out

        runner.graphs.replay = counted
    warmup = pb.WarmupRequest(max_batch_total_tokens=2048, max_total_tokens=64)
    run(svc.Warmup(warmup, FakeContext()))
    return svc


def _serve(svc, params: list[dict]) -> dict[int, list[tuple[int, float]]]:
    """Requests with these sampling parameters (and top_n_tokens) prefilled, decoded 4 steps,
    the second dropped, 3 more steps: each request's (id, logprob)s."""
    pool = BlockPool(30, seed=3)
    got: dict[int, list[tuple[int, float]]] = {}
    requests = []
    for i, kw in enumerate(params):
        top_n = kw.pop("top_n_tokens", 0)
        chooser = dict(temperature=1.0, top_p=1.0, typical_p=1.0, repetition_penalty=1.0)
        prompt = [3 + (13 * i + 5 * j) % 150 for j in range(7 + 2 * i)]
        requests.append(
            pool.request(
                i, prompt, 64 - len(prompt), top_n_tokens=top_n,
                parameters=pb.NextTokenChooserParameters(**{**chooser, **kw}),
            )
        )  # fmt: skip

    def record(resp) -> pb.CachedBatch:
        for g in resp.generations:
            got.setdefault(g.request_id, []).append((g.tokens.ids[0], g.tokens.logprobs[0]))
        return resp.batch

    batch = record(run(svc.Prefill(pb.PrefillRequest(batch=pb.Batch(id=1, requests=requests)),
                                   FakeContext())))  # fmt: skip
    for keep in (None, [r.id for r in requests if r.id != 1]):
        if keep is not None:
            batch = run(svc.FilterBatch(pb.FilterBatchRequest(batch_id=batch.id, request_ids=keep),
                                        FakeContext())).batch  # fmt: skip
        for _ in range(4 if keep is None else 3):
            batch = record(run(svc.Decode(pb.DecodeRequest(batches=[batch]), FakeContext())))
    return got


GREEDY = [{}, {}, {}]
CASES = {
    "all greedy": (GREEDY, 7),  # every decode step through the head
    "a sampled row": ([{}, {"do_sample": True, "seed": 5}, {}], 3),  # after it is dropped
    "alternatives": ([{}, {"top_n_tokens": 2}, {}], 3),
    "a penalty": ([{"repetition_penalty": 1.3}, {}, {}], 0),
}


@pytest.mark.parametrize("case", CASES)
def test_greedy_steps_take_the_graphs_head_and_give_the_eager_samplers_answers(
    servicer_model_dir, case
):
    params, heads = CASES[case]
    want = _serve(_service(servicer_model_dir, graphs=False), [dict(p) for p in params])
    svc = _service(servicer_model_dir, graphs=True)
    got = _serve(svc, [dict(p) for p in params])
    assert got.keys() == want.keys()
    for rid in want:
        assert [t for t, _ in got[rid]] == [t for t, _ in want[rid]], rid
        torch.testing.assert_close(
            torch.tensor([lp for _, lp in got[rid]]),
            torch.tensor([lp for _, lp in want[rid]]),
            atol=1e-5,
            rtol=0,
        )
    assert svc.runner.graphs.heads == heads
