"""Speculative decoding with a draft model on the shard (shard/draft.py): the guesses a step
answers are the draft model's own greedy continuation (transformers' on the draft checkpoint),
and proposing them in the next step, as the router does, gives every request exactly the tokens,
logprobs and alternatives it gets without speculation.

Drafts: the model itself (every greedy guess right), the model without its last layer (a
layer-skip draft: some right, some wrong) and another architecture with the same vocabulary
(Qwen2: guesses mostly wrong). The schedule mixes greedy, seeded, penalised and constrained
rows, a request joining in chunks beside drafting rows, and rows running out of KV slots.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from launcher.tiny_models import build_model
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

MAX_NEW = 14
K = 4


PARAMS = {
    0: chooser_params(),
    1: chooser_params(do_sample=True, temperature=0.8, seed=21),
    2: chooser_params(),
    3: chooser_params(repetition_penalty=1.3, frequency_penalty=0.4),
    10: chooser_params(),
    30: chooser_params(do_sample=True, seed=11),
}


def _service(model_dir, draft_dir=None, graphs: bool = False):
    """A warmed servicer; with `graphs`, the model's and the draft's decode graphs replayed by
    the CPU's stand-in (EagerReplayer), their replays counted in `replays`."""
    settings = ShardSettings(
        model_id=str(model_dir),
        uds_path="/unused",
        dtype="float32",
        draft_model=None if draft_dir is None else str(draft_dir),
    )
    service = build_service(settings)
    if graphs:
        _stand_in_graphs(service.runner)
    warmup = pb.WarmupRequest(max_batch_total_tokens=4096, max_total_tokens=80)
    run(service.Warmup(warmup, FakeContext()))
    return service


GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32)


def _stand_in_graphs(runner) -> None:
    """What startup builds with --cuda-graphs on a GPU (DecodeGraphs for the model with its
    sampling heads, for the draft with its guess), replayed by the CPU's stand-in."""
    from collections import Counter

    from shard.platforms.cuda.graphs import DecodeGraphs, EagerReplayer
    from shard.sampling.graph_heads import SamplingHeads

    runner.decode_path = runner.draft.decode_path = None  # the CPU's own decode loops
    runner.graphs = DecodeGraphs(
        runner.model, GRAPH_BUCKETS, runner.device, None, EagerReplayer(),
        heads=SamplingHeads(runner.model, runner.block_size),
    )  # fmt: skip
    runner.draft.graphs = DecodeGraphs(
        runner.draft.model, GRAPH_BUCKETS, runner.device, None, EagerReplayer(),
        heads=runner.draft.head,
    )  # fmt: skip
    runner.replays = Counter()
    for name, graphs in (("model", runner.graphs), ("draft", runner.draft.graphs)):

        def counted(*args, head=None, replay=graphs.replay, name=name):
            out = replay(*args, head=head)
            runner.replays[name, head] += out is not None
            return out

        graphs.replay = counted


@pytest.fixture(scope="module")
def layer_skip_dir(servicer_model_dir, tmp_path_factory):
    """The servicer's model without its last layer, saved by transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(servicer_model_dir, dtype=torch.float32)
    model.model.layers = model.model.layers[:-1]
    model.config.num_hidden_layers -= 1
    path = tmp_path_factory.mktemp("draft") / "layer-skip"
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(servicer_model_dir).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def drafts(servicer_model_dir, layer_skip_dir, tmp_path_factory):
    qwen = build_model(
        tmp_path_factory.mktemp("draft") / "qwen2", "Qwen2ForCausalLM", seed=5, hidden_size=32
    )
    # The layer-skip draft with a context shorter than the requests grow (36 positions): it
    # guesses only within it.
    short = tmp_path_factory.mktemp("draft") / "short-context"
    shutil.copytree(layer_skip_dir, short, dirs_exist_ok=True)
    config = json.loads((short / "config.json").read_text())
    config["max_position_embeddings"] = 36
    (short / "config.json").write_text(json.dumps(config))
    return {
        "itself": servicer_model_dir,
        "layer-skip": layer_skip_dir,
        "qwen2": qwen,
        "short-context": short,
    }


class Driver:
    """Serves the schedule; with `speculate`, asks for K guesses after each step and proposes
    each request's last guesses in its next step (cut where the grammar refuses, as the router
    cuts them)."""

    def __init__(self, svc, speculate: bool, pause_every: int = 0, reference=None) -> None:
        self.svc, self.pool, self.speculate = svc, BlockPool(80, seed=9), speculate
        # Every pause_every-th step asks for no guesses (as the router past
        # disable_by_batch_size): rows fall behind in the draft's cache and catch up later.
        self.pause_every, self.steps = pause_every, 0
        # With the plain run's tokens: request 2 is proposed those instead of its guesses (as
        # a router mixing proposers might), so the tokens it accepts differ from the guesses
        # whose K/V the draft wrote, which the draft must then not keep.
        self.reference = reference
        self.got: dict[int, list] = {}
        self.prompts: dict[int, list[int]] = {}
        self.guesses: dict[int, list[int]] = {}
        # (request, tokens known when guessed, guesses) for the oracle check
        self.guessed: list[tuple[int, list[int], list[int]]] = []
        self.proposed: dict[int, int] = {}  # by request
        self.accepted: dict[int, int] = {}
        self.mask = even_ids_mask(svc.runner.model.vocab_size)

    def request(self, rid: int, n: int, **kw) -> pb.Request:
        prompt = [3 + (11 * rid + 7 * j) % 150 for j in range(n)]
        self.prompts[rid] = prompt
        return self.pool.request(rid, prompt, MAX_NEW, parameters=PARAMS[rid], top_n_tokens=2, **kw)

    def _proposals(self, ids) -> dict[int, pb.Proposal]:
        out = {}
        for rid in ids:
            guess = self.guesses.pop(rid, [])
            if rid == 2 and self.reference is not None and guess:
                done = len(self.got[rid])
                guess = [t for t, _, _ in self.reference[rid][done : done + len(guess)]]
            if rid == 30:  # the grammar allows even ids only
                odd = [i for i, t in enumerate(guess) if t % 2]
                guess = guess[: odd[0]] if odd else guess
            if guess:
                masks = [self.mask] * len(guess) if rid == 30 else []
                out[rid] = pb.Proposal(ids=guess, token_masks=masks)
        return out

    def record(self, resp, proposals) -> pb.CachedBatch | None:
        for g in resp.generations:
            ids = list(g.tokens.ids)
            rid = g.request_id
            if rid in proposals:
                self.proposed[rid] = self.proposed.get(rid, 0) + len(proposals[rid].ids)
                self.accepted[rid] = self.accepted.get(rid, 0) + len(ids) - 1
            for i, t in enumerate(ids):
                top = list(g.top_tokens[i].ids)
                self.got.setdefault(g.request_id, []).append((t, g.tokens.logprobs[i], top))
            if g.draft_ids:
                self.guesses[g.request_id] = list(g.draft_ids)
                known = self.prompts[g.request_id] + [t for t, _, _ in self.got[g.request_id]]
                self.guessed.append((g.request_id, known, list(g.draft_ids)))
        done = [r for r in resp.batch.request_ids if len(self.got.get(r, [])) >= MAX_NEW]
        keep = [r for r in resp.batch.request_ids if r not in done]
        for rid in done:
            self.guesses.pop(rid, None)
        if not done:
            return resp.batch
        if not keep:
            run(self.svc.ClearCache(pb.ClearCacheRequest(id=resp.batch.id), FakeContext()))
            return None
        request = pb.FilterBatchRequest(batch_id=resp.batch.id, request_ids=keep)
        return run(self.svc.FilterBatch(request, FakeContext())).batch

    def _draft_tokens(self) -> int:
        self.steps += 1
        if not self.speculate or (self.pause_every and self.steps % self.pause_every == 0):
            return 0
        return K

    def _masks(self, ids) -> dict[int, bytes]:
        return {30: self.mask} if 30 in ids else {}

    def prefill(self, batch_id, requests, cached=None, chunks=None):
        cached_ids = list(cached.request_ids) if cached is not None else []
        proposals = self._proposals(cached_ids)
        request = pb.PrefillRequest(
            batch=pb.Batch(id=batch_id, requests=requests),
            cached_batches=[cached] if cached is not None else [],
            prefill_chunks=chunks or {},
            token_masks=self._masks(cached_ids + [r.id for r in requests]),
            proposals=proposals,
            draft_tokens=self._draft_tokens(),
        )
        return self.record(run(self.svc.Prefill(request, FakeContext())), proposals)

    def decode(self, batch):
        proposals = self._proposals(batch.request_ids)
        request = pb.DecodeRequest(
            batches=[batch],
            token_masks=self._masks(batch.request_ids),
            proposals=proposals,
            draft_tokens=self._draft_tokens(),
        )
        return self.record(run(self.svc.Decode(request, FakeContext())), proposals)


def _serve(d: Driver) -> dict:
    a = d.prefill(1, [d.request(i, 6 + 3 * i) for i in range(4)])
    a = d.decode(a)
    # Request 10 joins in two chunks beside the drafting rows: its prompt is mirrored into the
    # draft's cache chunk by chunk.
    a = d.prefill(2, [d.request(10, 30)], cached=a, chunks={10: 16})
    a = d.decode(a)
    c = d.prefill(3, [d.request(30, 7, constrained=True)])
    while a is not None:
        a = d.decode(a)
    while c is not None:
        c = d.decode(c)
    run(d.svc.ClearCache(pb.ClearCacheRequest(), FakeContext()))
    return {rid: toks[:MAX_NEW] for rid, toks in d.got.items()}


@pytest.fixture(scope="module")
def reference(servicer_model_dir):
    return _serve(Driver(_service(servicer_model_dir), speculate=False))


def _draft_greedy(draft_dir, known: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = _draft_greedy.models.get(draft_dir)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
        _draft_greedy.models[draft_dir] = model
    with torch.no_grad():
        out = model.generate(
            torch.tensor([known]), max_new_tokens=n, do_sample=False, eos_token_id=None,
            pad_token_id=0,
        )  # fmt: skip
    return out[0, len(known) :].tolist()


_draft_greedy.models = {}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "draft, pause_every",
    [("itself", 0), ("layer-skip", 0), ("layer-skip", 3), ("qwen2", 0), ("short-context", 0)],
    ids=["itself", "layer-skip", "layer-skip-paused", "qwen2", "short-context"],
)
def test_draft_guesses_verified_give_the_tokens_of_plain_steps(
    servicer_model_dir, drafts, reference, draft, pause_every
):
    svc = _service(servicer_model_dir, drafts[draft])
    d = Driver(svc, speculate=True, pause_every=pause_every, reference=reference)
    assert_same_tokens(_serve(d), reference, atol=1e-4)
    # Every answer's guesses are the draft's greedy continuation of the tokens known then:
    # its cache held the right K/V for every position it read (prompt chunks mirrored,
    # confirmed guesses kept, the rest caught up).
    assert d.guessed
    for rid, known, guesses in d.guessed:
        assert len(guesses) <= min(K, len(d.prompts[rid]) + MAX_NEW - len(known)), rid
        if draft == "short-context":
            assert len(known) + len(guesses) <= 36 + 1, rid
        assert guesses == _draft_greedy(drafts[draft], known, len(guesses)), (rid, known)
    proposed, accepted = sum(d.proposed.values()), sum(d.accepted.values())
    assert proposed > 0
    if draft == "itself":  # a greedy row without penalties takes every guess
        for rid in (0, 10):
            assert d.accepted[rid] == d.proposed[rid] > 0, rid
    elif draft == "layer-skip":
        assert 0 < accepted < proposed
    assert d.accepted[2] == d.proposed[2] > 0  # the plain run's tokens, all right


def test_draft_steps_replayed_from_graphs_guess_as_eager_ones(
    servicer_model_dir, drafts, reference
):
    """With decode graphs (as --cuda-graphs builds them on a GPU): the draft's one-token steps
    replay its graphs, which end with the guess; the guesses are still the draft's greedy
    continuation and the tokens the plain steps' (the model's verify steps replaying its
    graphs too)."""
    svc = _service(servicer_model_dir, drafts["layer-skip"], graphs=True)
    d = Driver(svc, speculate=True, pause_every=3, reference=reference)
    assert_same_tokens(_serve(d), reference, atol=1e-4)
    for rid, known, guesses in d.guessed:
        assert guesses == _draft_greedy(drafts["layer-skip"], known, len(guesses)), (rid, known)
    replays = svc.runner.replays
    assert replays["draft", "guess"] > 0
    # The model's steps (alternatives asked, seeded, penalised and constrained rows) sample
    # inside its graphs.
    assert replays["model", "sample"] > 0


def test_draft_tokens_need_a_draft_model(servicer_model_dir, drafts):
    plain = Driver(_service(servicer_model_dir), speculate=False)
    batch = plain.prefill(1, [plain.request(0, 6)])
    request = pb.DecodeRequest(batches=[batch], draft_tokens=2)
    with pytest.raises(AbortError, match="without a draft model"):
        run(plain.svc.Decode(request, FakeContext()))
    svc = _service(servicer_model_dir, drafts["layer-skip"])
    d = Driver(svc, speculate=True)
    batch = d.prefill(1, [d.request(0, 6)])
    with pytest.raises(AbortError, match="at most 16"):
        run(svc.Decode(pb.DecodeRequest(batches=[batch], draft_tokens=17), FakeContext()))
    info = run(svc.Info(pb.InfoRequest(), FakeContext()))
    assert info.draft_model_id == str(drafts["layer-skip"])


def test_a_prefix_found_in_the_cache_holds_the_drafts_k_v(servicer_model_dir, drafts):
    """Request 51 starts with request 0's first two blocks (prefix_len 32, as the router's
    prefix cache hands them out): the draft reads their K/V, which request 0's prompt chunks
    wrote although request 0 never drafted (steps past disable_by_batch_size ask for none), so
    its guesses are still the draft's own greedy continuation."""
    from tests.shard.servicer_helpers import BLOCK_SIZE

    svc = _service(servicer_model_dir, drafts["layer-skip"])
    d = Driver(svc, speculate=False)
    first = d.request(0, 40)
    a = d.prefill(1, [first], chunks={0: 16})  # mirrored chunk by chunk
    a = d.decode(a)
    d.speculate = True
    prompt = list(first.input_ids[:32]) + [7, 9, 11, 13, 15, 17, 19, 21]
    fresh = [d.pool.free.pop() for _ in range(3)]
    blocks = list(first.blocks[:2]) + fresh
    total = len(prompt) + MAX_NEW
    slots = [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(total)]
    d.prompts[51] = prompt
    second = pb.Request(
        id=51, input_ids=prompt, blocks=blocks, slots=slots, prefix_len=32,
        parameters=PARAMS[0], top_n_tokens=2,
        stopping_parameters=pb.StoppingCriteriaParameters(max_new_tokens=MAX_NEW),
    )  # fmt: skip
    b = d.prefill(2, [second])
    d.decode(b)
    checked = [(known, g) for rid, known, g in d.guessed if rid == 51]
    assert len(checked) == 2
    for known, guesses in checked:
        assert guesses == _draft_greedy(drafts["layer-skip"], known, len(guesses))
