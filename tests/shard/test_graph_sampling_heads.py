"""Decode steps replayed with their logits and sampling inside the graph
(shard/sampling/graph_heads.py, replayed by shard/platforms/cuda/graphs.py) give the tokens and
logprobs of the eager sampler with a GPU's static shapes, for every kind of row a head holds:
greedy, seeded temperature, top-k/top-p/min-p, penalties, a logit bias, a grammar's masks,
alternatives, and batches that mix them; steps no head holds (more alternatives than captured,
typical-p) replay the forward pass alone and sample eagerly, as before. Choosing a head and
filling its buffers reads nothing of the device (HostSyncGuard around every launch, as
tests/shard/test_step_host_syncs.py does).

On a CPU the graphs are `EagerReplayer`'s (the captured function run again on the same static
buffers); on a GPU the same cases replay startup's real CUDA graphs, under torch's sync debug
mode.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from shard.platforms import platform_of
from shard.platforms.cuda.graphs import DecodeGraphs, EagerReplayer
from shard.sampling.graph_heads import BIAS_WIDTH, DEFAULT_TOP_N, HISTORY_WIDTH, SamplingHeads
from shard.sampling.params import SamplingParams
from shard.sampling.sampler import SamplingTensors
from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2 as pb
from tests.host_sync_guard import CudaSyncGuard, HostSyncGuard, guard_launches
from tests.shard.servicer_helpers import BlockPool, FakeContext, run

BUCKETS = (1, 2, 4)
MAX_TOTAL_TOKENS = 64


CUDA = torch.cuda.is_available()


def _service(model_dir, graphs: str):
    """A warmed float32 servicer; graphs "off", "eager" (EagerReplayer) or "cuda" (startup's
    CUDA graphs, with their heads)."""
    svc = build_service(
        ShardSettings(
            model_id=str(model_dir), uds_path="/unused", dtype="float32", overlap_schedule="off",
            cuda_graphs=BUCKETS if graphs == "cuda" else (),
        )
    )  # fmt: skip
    runner = svc.runner
    runner.decode_path = None  # compare the graphs with the generic eager forward pass
    if graphs == "eager":
        model = runner.model
        runner.graphs = DecodeGraphs(
            model, BUCKETS, runner.device, None, EagerReplayer(),
            heads=SamplingHeads(model, runner.block_size),
        )  # fmt: skip
    if runner.graphs is not None:
        runner.graphs.heads_used = Counter()
        replay = runner.graphs.replay

        def counted(*args, head=None):
            out = replay(*args, head=head)
            if head is not None and out is not None:
                runner.graphs.heads_used[head] += 1
            return out

        runner.graphs.replay = counted
    warmup = pb.WarmupRequest(max_batch_total_tokens=2048, max_total_tokens=MAX_TOTAL_TOKENS)
    run(svc.Warmup(warmup, FakeContext()))
    return svc


def _mask(step: int, vocab: int) -> bytes:
    """A grammar's mask for one step: ids below 3/4 of the vocabulary, a third of them, which
    third changing each step; packed narrower than the vocabulary (the rest is not allowed)."""
    ids = [i for i in range(3 * vocab // 4) if (i + step) % 3 == 0]
    words = torch.zeros(-(-(3 * vocab // 4) // 32), dtype=torch.int64)
    for i in ids:
        words[i // 32] |= 1 << (i % 32)
    return words.to(torch.int32).numpy().tobytes()


def _serve(
    svc, params: list[dict], proposals: list[dict[int, list[int]]] = ()
) -> dict[int, list[tuple[int, float]]]:
    """Requests with these sampling parameters (and top_n_tokens, constrained) prefilled,
    decoded 4 steps, the second dropped, 3 more steps, then a step verifying each of
    `proposals` (by request id): each request's (id, logprob)s."""
    pool = BlockPool(30, seed=3)
    vocab = svc.runner.model.vocab_size
    got: dict[int, list[tuple[int, float]]] = {}
    requests, constrained = [], set()
    for i, kw in enumerate(params):
        top_n = kw.pop("top_n_tokens", 0)
        if kw.pop("constrained", False):
            constrained.add(i)
        chooser = dict(temperature=1.0, top_p=1.0, typical_p=1.0, repetition_penalty=1.0)
        prompt = [3 + (13 * i + 5 * j) % 150 for j in range(7 + 2 * i)]
        requests.append(
            pool.request(
                i, prompt, MAX_TOTAL_TOKENS - len(prompt), top_n_tokens=top_n,
                constrained=i in constrained,
                parameters=pb.NextTokenChooserParameters(**{**chooser, **kw}),
            )
        )  # fmt: skip
    steps = iter(range(100))

    def masks(alive: set[int]) -> dict[int, bytes]:
        step = next(steps)
        return {rid: _mask(step, vocab) for rid in constrained & alive}

    def record(resp) -> pb.CachedBatch:
        for g in resp.generations:
            for i, (token, logprob) in enumerate(zip(g.tokens.ids, g.tokens.logprobs, strict=True)):
                top = g.top_tokens[i] if g.top_tokens else pb.Tokens()
                # (id, logprob), then the alternatives' (ids, logprobs)
                entry = [(token, logprob), *zip(top.ids, top.logprobs, strict=True)]
                got.setdefault(g.request_id, []).append(entry)
        return resp.batch

    alive = set(range(len(params)))
    prefill = pb.PrefillRequest(batch=pb.Batch(id=1, requests=requests), token_masks=masks(alive))
    batch = record(run(svc.Prefill(prefill, FakeContext())))
    for keep in (None, [r.id for r in requests if r.id != 1]):
        if keep is not None:
            alive = set(keep)
            batch = run(svc.FilterBatch(pb.FilterBatchRequest(batch_id=batch.id, request_ids=keep),
                                        FakeContext())).batch  # fmt: skip
        for _ in range(4 if keep is None else 3):
            step = pb.DecodeRequest(batches=[batch], token_masks=masks(alive))
            batch = record(run(svc.Decode(step, FakeContext())))
    for proposed in proposals:
        step = pb.DecodeRequest(
            batches=[batch], proposals={rid: pb.Proposal(ids=ids) for rid, ids in proposed.items()}
        )
        batch = record(run(svc.Decode(step, FakeContext())))
    return got


SAMPLED = {"do_sample": True, "seed": 5, "temperature": 0.8}
# params, and the heads its 7 decode steps take (4 with row 1, 3 without)
CASES = {
    "all greedy": ([{}, {}, {}], {"greedy": 7}),
    "a sampled row": ([{}, SAMPLED, {}], {"sample": 4, "greedy": 3}),
    "truncated rows": (
        [
            {"do_sample": True, "top_k": 5, "seed": 1},
            {"do_sample": True, "top_p": 0.8, "seed": 2},
            {"do_sample": True, "min_p": 0.1, "temperature": 1.3, "seed": 3},
        ],
        {"truncate": 7},
    ),
    "penalties": (
        [{}, {"frequency_penalty": 0.5, "presence_penalty": 0.3}, {"repetition_penalty": 1.3}],
        {"sample": 7},
    ),
    "a logit bias": (
        [{}, {"logit_bias": {5: 2.0, 9: -3.0, 40: 1.5}}, {}],
        {"sample": 4, "greedy": 3},
    ),
    # After the filter no row is constrained, and the last row takes the masked row's place:
    # its mask must not stay there.
    "a grammar's masks": (
        [{**SAMPLED, "seed": 8}, {"constrained": True, **SAMPLED}, {**SAMPLED, "seed": 9}],
        {"sample": 7},
    ),
    "a greedy grammar": ([{}, {"constrained": True}, {}], {"sample": 4, "greedy": 3}),
    "a mixed batch": (
        [
            {"repetition_penalty": 1.2, "constrained": True},
            {"do_sample": True, "top_k": 3, "top_p": 0.9, "seed": 9, "top_n_tokens": 4},
            {**SAMPLED, "frequency_penalty": 0.4, "logit_bias": {7: 1.0}},
        ],
        {"truncate": 4, "sample": 3},
    ),
    # A greedy row asking for alternatives takes "sample"; more than the heads were captured
    # for (Warmup's batch, here none: the router's default), no head.
    "alternatives": ([{}, {"top_n_tokens": 2}, {"top_n_tokens": 5}], {"sample": 7}),
    "more alternatives than a head gives": (
        [{}, {"top_n_tokens": DEFAULT_TOP_N + 1}, {}],
        {"greedy": 3},
    ),
    "typical-p": ([{}, {"do_sample": True, "typical_p": 0.9, "seed": 4}, {}], {"greedy": 3}),
}


@pytest.mark.parametrize(
    "graphs",
    [
        "eager",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not CUDA, reason="CUDA graphs are captured by torch.cuda"),
        ),
    ],
)
@pytest.mark.parametrize("case", CASES)
def test_decode_steps_sample_inside_the_graph_as_the_eager_sampler_does(
    servicer_model_dir, case, graphs, monkeypatch
):
    # The eager sampler as on a GPU (whole sorted rows, every tail inverted), which the heads
    # follow; tests/shard/test_sampling_static.py holds it to the CPU's own shortcuts.
    monkeypatch.setattr(platform_of(torch.device("cpu")), "static_shapes", True)
    params, heads = CASES[case]
    want = _serve(_service(servicer_model_dir, "off"), [dict(p) for p in params])
    svc = _service(servicer_model_dir, graphs)
    if graphs == "eager":
        guards = guard_launches(svc.runner, HostSyncGuard, exempt_forward=True)
    else:
        guards = guard_launches(svc.runner, CudaSyncGuard)
    got = _serve(svc, [dict(p) for p in params])
    assert len(guards) == 1 + 7
    _assert_same(got, want)
    assert svc.runner.graphs.heads_used == Counter(heads)


def _assert_same(got: dict, want: dict) -> None:
    """The same ids (chosen and alternatives) and logprobs within float32 rounding. Which
    removed tokens fill alternatives past a truncated row's kept ones (-inf each) is
    arbitrary, as in tests/shard/test_sampling_static.py."""

    def ids(entries: list) -> list[list[int | None]]:
        return [[t if lp > float("-inf") else None for t, lp in entry] for entry in entries]

    assert got.keys() == want.keys()
    for rid in want:
        # the message: each step's (id, logprob)s where they differ, to tell a tie from a fault
        differ = [(g, w) for g, w in zip(got[rid], want[rid], strict=False) if ids([g]) != ids([w])]
        assert ids(got[rid]) == ids(want[rid]), (rid, differ[:2])
        torch.testing.assert_close(
            torch.tensor([lp for entry in got[rid] for _, lp in entry]),
            torch.tensor([lp for entry in want[rid] for _, lp in entry]),
            atol=1e-5,
            rtol=0,
        )


class _Model:
    vocab_size = 100


def _heads(rows: int = 4) -> SamplingHeads:
    heads = SamplingHeads(_Model(), block_size=4)
    heads.allocate(rows, block_table_width=2, device=torch.device("cpu"), top_n=3)
    return heads


def _sampling(rows: int, **kw) -> SamplingTensors:
    return SamplingTensors.from_params([SamplingParams(**kw)] * rows, [3] * rows, "cpu")


def test_a_step_no_head_can_hold_samples_eagerly():
    heads = _heads(rows=4)
    history, lens = torch.zeros(2, 5, dtype=torch.int64), torch.full((2,), 3)
    sampled = dict(do_sample=True, seed=1)
    assert heads.prepare(_sampling(2), history, lens, None) == "greedy"
    assert heads.prepare(_sampling(2, **sampled), history, lens, None) == "sample"
    assert heads.prepare(_sampling(2, **sampled, top_p=0.5), history, lens, None) == "truncate"
    # more rows than the buffers, typical-p, a bias or a history wider than they hold
    assert heads.prepare(_sampling(2), history, lens, None, top_n=3) == "sample"
    assert heads.prepare(_sampling(2), history, lens, None, top_n=4) is None
    assert heads.prepare(_sampling(5, **sampled), history, lens, None) is None
    assert heads.prepare(_sampling(2, **sampled, typical_p=0.5), history, lens, None) is None
    wide_bias = [(i, 1.0) for i in range(BIAS_WIDTH + 1)]
    assert heads.prepare(_sampling(2, logit_bias=wide_bias), history, lens, None) is None
    # Penalties need the history a head holds (2 blocks of 4 here, and at most HISTORY_WIDTH);
    # the rest of a row's reservation past what the step's samples see does not count.
    wide = torch.zeros(2, 2 * 4 + 2, dtype=torch.int64)
    penalised = _sampling(2, repetition_penalty=1.1)
    assert heads.prepare(penalised, wide, lens, None, longest=2 * 4 + 2) is None
    assert heads.prepare(penalised, wide, lens, None, longest=3) == "sample"
    huge = SamplingHeads(_Model(), block_size=16)
    huge.allocate(1, block_table_width=8192, device=torch.device("cpu"))
    assert huge.history.shape[1] == HISTORY_WIDTH


def test_steps_verifying_proposals_sample_inside_the_graph(servicer_model_dir, monkeypatch):
    """A step verifying proposals samples once per token (shard/speculation.py), each sample
    with its row's parameters and history: a penalised, a seeded and a top-k row."""
    monkeypatch.setattr(platform_of(torch.device("cpu")), "static_shapes", True)
    params = [{"repetition_penalty": 1.2}, SAMPLED, {**SAMPLED, "top_k": 4, "seed": 6}]
    proposals = [{0: [5], 2: [9]}, {0: [7, 8]}]  # 4, then 3 samples: buckets 4 and 4
    want = _serve(_service(servicer_model_dir, "off"), [dict(p) for p in params], proposals)
    svc = _service(servicer_model_dir, "eager")
    got = _serve(svc, [dict(p) for p in params], proposals)
    _assert_same(got, want)
    assert svc.runner.graphs.heads_used == Counter({"truncate": 4 + 3 + 2})


def test_the_heads_give_the_alternatives_warmup_asks_for(servicer_model_dir):
    """The router's Warmup batch asks for its --max-top-n-tokens: the heads are captured for
    that many, more or fewer than the default."""
    for top_n in (0, 7):
        svc = build_service(
            ShardSettings(model_id=str(servicer_model_dir), uds_path="/unused", dtype="float32")
        )
        runner = svc.runner
        heads = SamplingHeads(runner.model, runner.block_size)
        runner.graphs = DecodeGraphs(
            runner.model, BUCKETS, runner.device, None, EagerReplayer(), heads=heads
        )
        request = BlockPool(8, seed=1).request(0, [3, 4, 5], 8, top_n_tokens=top_n)
        # A KV budget of its own: left out, a GPU's Warmup takes most of the device's memory,
        # which the tests running beside this one share.
        warmup = pb.WarmupRequest(
            batch=pb.Batch(id=0, requests=[request]),
            max_total_tokens=MAX_TOTAL_TOKENS,
            max_batch_total_tokens=4096,
        )
        run(svc.Warmup(warmup, FakeContext()))
        assert heads.top_n == top_n
        hidden = torch.zeros(2, runner.model.config.hidden_size, device=runner.device)
        ids, chosen, top_ids, top_logprobs = heads.head("sample")(hidden)
        assert top_ids.shape == top_logprobs.shape == (2, top_n)
