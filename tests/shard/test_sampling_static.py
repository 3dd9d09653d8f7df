"""shard.sampling where the platform keeps shapes static (`Platform.static_shapes`, a GPU's
path), run on the CPU by switching the flag: the same tokens, logprobs and top-n as the CPU's
data-dependent path, its own distribution, and nothing in sample() or SamplingTensors that
would make the host wait for the device."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from shard.platforms import platform_of
from shard.sampling import sampler as sampling
from shard.sampling import truncation
from shard.sampling.params import SamplingParams
from shard.sampling.sampler import SampleOutput, SamplingTensors, sample
from shard.sampling.token_masks import TokenMasks
from tests.host_sync_guard import HostSyncError, HostSyncGuard

CPU = torch.device("cpu")
META = torch.device("meta")

# One batch of rows per kind. top_k stays below 255: the dynamic path's candidate widths are
# then multiples of 256, where float32 sums over its rows and over the static path's
# -inf-padded whole rows round alike (test_logprobs_stay_within_rounding_at_odd_widths).
KINDS = {
    "greedy": SamplingParams(),
    "plain": SamplingParams(do_sample=True),
    "temperature": SamplingParams(do_sample=True, temperature=0.7),
    "top_k": SamplingParams(do_sample=True, top_k=40),
    "top_k_wide": SamplingParams(do_sample=True, top_k=200, temperature=1.3),
    "top_k_small": SamplingParams(do_sample=True, top_k=3),  # fewer kept than top_n
    "top_p": SamplingParams(do_sample=True, top_p=0.9),
    "top_p_wide": SamplingParams(do_sample=True, top_p=0.999),  # flat rows: > 256 candidates
    "min_p": SamplingParams(do_sample=True, min_p=0.05),
    "min_p_wide": SamplingParams(do_sample=True, min_p=1e-4),
    "typical": SamplingParams(do_sample=True, typical_p=0.7),
    "typical_wide": SamplingParams(do_sample=True, typical_p=0.99, temperature=1.5),
    "all_warpers": SamplingParams(
        do_sample=True, temperature=1.2, top_k=150, top_p=0.95, min_p=0.01, typical_p=0.9
    ),
}
ROWS_PER_KIND = 8
TOP_N = 5


@contextmanager
def _static(monkeypatch: pytest.MonkeyPatch, device: torch.device = CPU):
    with monkeypatch.context() as m:
        m.setattr(platform_of(device), "static_shapes", True)
        yield


def _logits(batch: int, vocab: int, seed: int) -> torch.Tensor:
    """Random float32 logits (no ties); every other row flat, so that its draws often land in
    the tail and its wide nuclei outgrow the first candidates."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.where(torch.arange(batch) % 2 == 0, 3.0, 0.3)
    return torch.randn(batch, vocab, generator=g) * scale[:, None]


def _rows(kinds: list[str], **extra) -> list[SamplingParams]:
    """ROWS_PER_KIND rows of each kind, each with its own seed."""
    rows = []
    for k, kind in enumerate(kinds):
        for i in range(ROWS_PER_KIND):
            fields = {**KINDS[kind].__dict__, **extra, "seed": 1000 * k + i}
            rows.append(SamplingParams(**fields))
    return rows


def _inputs(params: list[SamplingParams], vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 1)
    batch = len(params)
    history = torch.randint(0, vocab, (batch, 16), generator=g)
    lens = torch.randint(4, 17, (batch,), generator=g)
    tensors = SamplingTensors.from_params(params, [3] * batch, CPU)
    return _logits(batch, vocab, seed), tensors, history, lens


def _masks(batch: int, vocab: int, seed: int = 2) -> TokenMasks:
    """Every third row constrained to a random half of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(0, batch, 3)
    words = torch.randint(-(2**31), 2**31, (rows.shape[0], -(-vocab // 32)), generator=g)
    return TokenMasks(rows, words.to(torch.int32))


def _both(monkeypatch, logits, tensors, history, lens, masks=None):
    dynamic = sample(logits, tensors, history, lens, TOP_N, masks)
    with _static(monkeypatch):
        static = sample(logits, tensors, history, lens, TOP_N, masks)
    return dynamic, static


def _assert_same(dynamic: SampleOutput, static: SampleOutput) -> None:
    assert torch.equal(dynamic.next_ids, static.next_ids)
    assert torch.equal(dynamic.logprobs, static.logprobs)
    assert torch.equal(dynamic.top_logprobs, static.top_logprobs)
    # Which removed tokens fill a top-n past the kept ones (-inf each) is arbitrary.
    finite = torch.isfinite(dynamic.top_logprobs)
    assert torch.equal(dynamic.top_ids[finite], static.top_ids[finite])


@pytest.fixture
def exercised(monkeypatch):
    """Records, on the dynamic path, how many rows drew from the tail and the widest group of
    candidates: the test then knows it compared against the shortcuts, not around them."""
    seen = {"tail_rows": 0, "widest": 0}
    invert, groups = sampling._invert_tail, sampling.candidate_groups

    def spy_invert(values, *args):
        if not platform_of(values).static_shapes:
            seen["tail_rows"] += values.shape[0]
        return invert(values, *args)

    def spy_groups(*args, **kwargs):
        for group in groups(*args, **kwargs):
            seen["widest"] = max(seen["widest"], group.logits.shape[1])
            yield group

    monkeypatch.setattr(sampling, "_invert_tail", spy_invert)
    monkeypatch.setattr(sampling, "candidate_groups", spy_groups)
    return seen


# --- the same ids, logprobs and top-n as the dynamic path --------------------------------------


@pytest.mark.parametrize("vocab", [1000, 5000])
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_of_row_samples_as_on_the_cpu_path(kind, vocab, monkeypatch):
    _assert_same(*_both(monkeypatch, *_inputs(_rows([kind]), vocab)))


@pytest.mark.parametrize("vocab", [1000, 5000])
def test_mixed_batch_with_penalties_bias_and_masks(vocab, monkeypatch, exercised):
    extras = [
        {},
        {"repetition_penalty": 1.3},
        {"frequency_penalty": 0.5, "presence_penalty": 0.4},
        {"logit_bias": ((3, 5.0), (17, -100.0), (vocab - 1, 2.5))},
    ]
    for step, extra in enumerate(extras):
        params = _rows(list(KINDS), **extra)
        # Interleaved, so that dense and truncated rows alternate within the batch.
        order = torch.randperm(len(params), generator=torch.Generator().manual_seed(step))
        params = [params[i] for i in order.tolist()]
        logits, tensors, history, lens = _inputs(params, vocab, seed=step)
        for masks in (None, _masks(len(params), vocab)):
            _assert_same(*_both(monkeypatch, logits, tensors, history, lens, masks))
    assert exercised["tail_rows"] > 0
    assert exercised["widest"] > truncation.CANDIDATES


def test_logprobs_stay_within_rounding_at_odd_widths(monkeypatch):
    """With top_k >= 255 the dynamic path's width (top_k + 1) is no multiple of 256: its sums
    may round unlike the static path's over whole rows (an ulp, in a few rows of a hundred);
    the ids stay the same."""
    params = [
        SamplingParams(do_sample=True, top_k=333, top_p=0.99 if s % 2 else 1.0, seed=s)
        for s in range(128)
    ]
    dynamic, static = _both(monkeypatch, *_inputs(params, 1000))
    assert torch.equal(dynamic.next_ids, static.next_ids)
    torch.testing.assert_close(dynamic.logprobs, static.logprobs, rtol=0, atol=1e-5)
    torch.testing.assert_close(dynamic.top_logprobs, static.top_logprobs, rtol=0, atol=1e-5)


# --- nothing that makes the host wait ------------------------------------------------------------


@pytest.mark.parametrize("kind", [*KINDS, "mixed"])
def test_static_sample_reads_nothing_back(kind, monkeypatch):
    vocab = 1000
    kinds = list(KINDS) if kind == "mixed" else [kind]
    extra = {"repetition_penalty": 1.2, "frequency_penalty": 0.3, "presence_penalty": 0.2}
    params = _rows(kinds, **(extra if kind == "mixed" else {}))
    if kind == "mixed":
        params[0] = SamplingParams(do_sample=True, top_p=0.8, logit_bias=((5, 3.0),))
    logits, tensors, history, lens = _inputs(params, vocab)
    masks = _masks(len(params), vocab) if kind == "mixed" else None
    with _static(monkeypatch), HostSyncGuard() as guard:
        out = sample(logits, tensors, history, lens, TOP_N, masks)
    assert guard.checked == 1 and out.next_ids.shape == (len(params),)


def test_the_guard_catches_the_cpu_paths_reads():
    """The default path reads which rows drew from the tail: the guard must say so, or the
    test above proves nothing."""
    params = _rows(["plain"])
    logits, tensors, history, lens = _inputs(params, 1000)
    with pytest.raises(HostSyncError, match="nonzero"), HostSyncGuard():
        sample(logits, tensors, history, lens, TOP_N)


def test_static_sample_runs_on_a_device_without_data(monkeypatch):
    """On the meta device any read of a value fails, guard or not: the static path runs there
    to the end (every shape follows from the batch alone)."""
    params = _rows(list(KINDS), repetition_penalty=1.1, frequency_penalty=0.2)
    logits, tensors, history, lens = _inputs(params, 1000)
    masks = _masks(len(params), 1000)
    masks = TokenMasks(masks.rows.to(META), masks.words.to(META))
    on_meta = [t.to(META) for t in (logits, history, lens)]
    with _static(monkeypatch, META):
        out = sample(on_meta[0], tensors.to(META), *on_meta[1:], TOP_N, masks)
    assert out.next_ids.device == META and out.top_ids.shape == (len(params), TOP_N)


# --- SamplingTensors: derived on the host ----------------------------------------------------


MIXED = [
    SamplingParams(),
    SamplingParams(do_sample=True, top_k=5, seed=3, logit_bias=((4, 1.0), (9, -2.0))),
    SamplingParams(repetition_penalty=1.1),
    SamplingParams(do_sample=True, temperature=0.5, seed=2**63 + 7),
    SamplingParams(do_sample=True, typical_p=0.5, frequency_penalty=0.2),
    SamplingParams(do_sample=True, top_k=70, top_p=0.9),
]


def _assert_rows(on_device: SamplingTensors, params: list[SamplingParams]) -> None:
    """on_device holds params' rows: its host copy equals the CPU-built tensors, and every
    device tensor has the host one's shape and dtype."""
    expected = SamplingTensors.from_params(params, [3] * len(params), CPU)
    host = on_device.host
    assert host.device == CPU and host.flags == expected.flags == on_device.flags
    for name, value in expected.__dict__.items():
        if name == "flags":
            continue
        got, moved = getattr(host, name), getattr(on_device, name)
        assert (moved.device, moved.dtype, moved.shape) == (META, got.dtype, got.shape), name
        if name in ("bias_ids", "bias_values"):  # columns past the kept rows' bias: padding
            assert not got[:, value.shape[1] :].any(), name
            got = got[:, : value.shape[1]]
        assert torch.equal(got, value), name


def test_tensors_never_read_the_device():
    """Built, indexed and concatenated for the meta device, whose tensors hold no values to
    read: everything the sampler's host needs comes from the host copy.

    (Not under HostSyncGuard: on the CPU it cannot tell the host copy's reads, which are the
    point, from the device's.)"""
    full = SamplingTensors.from_params(MIXED, [3] * len(MIXED), META)
    _assert_rows(full, MIXED)
    keep = [5, 0, 3]
    _assert_rows(full.index(torch.tensor(keep)), [MIXED[i] for i in keep])
    mask = torch.tensor([True, False, True, False, True, True])
    _assert_rows(full.index(mask), [MIXED[0], MIXED[2], MIXED[4], MIXED[5]])
    _assert_rows(full.index(torch.tensor([], dtype=torch.int64)), [])
    head = SamplingTensors.from_params(MIXED[:2], [3, 3], META)
    tail = SamplingTensors.from_params(MIXED[2:], [3] * 4, META)
    _assert_rows(SamplingTensors.concat([head, tail]), MIXED)
    assert full.to(META) is full and full.to(CPU) is full.host


def test_on_the_cpu_the_host_copy_is_the_tensors_themselves():
    t = SamplingTensors.from_params(MIXED, [3] * len(MIXED), CPU)
    assert t.host is t and t.to(CPU) is t
    assert t.index(torch.tensor([1, 2])).host.top_k.tolist() == [5, 0]


# --- the static path's distribution ------------------------------------------------------------


def _warped_probs(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """transformers' temperature, top-k and top-p on one row, as probabilities."""
    scores = row[None, :] / p.temperature
    if p.top_k > 0:
        scores = TopKLogitsWarper(p.top_k)(None, scores)
    if p.top_p < 1:
        scores = TopPLogitsWarper(p.top_p)(None, scores)
    return torch.softmax(scores[0].double(), dim=-1)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(do_sample=True, temperature=0.9, top_p=0.8),
        SamplingParams(do_sample=True, temperature=1.5, top_k=12, top_p=0.95),
        SamplingParams(do_sample=True, temperature=2.0),  # dense: the tail's inversion
    ],
    ids=["top_p", "top_k_top_p", "dense"],
)
def test_static_draws_follow_the_warped_softmax(params, monkeypatch):
    # A head of 3 tokens and blocks of 5: most draws go through the tail, in several blocks.
    monkeypatch.setattr(sampling, "HEAD_SIZE", 3)
    monkeypatch.setattr(sampling, "TAIL_BLOCK", 5)
    draws, vocab = 20_000, 24
    order = torch.randperm(vocab, generator=torch.Generator().manual_seed(7))
    row = torch.linspace(-2.0, 2.5, vocab)[order]
    rows = [SamplingParams(**{**params.__dict__, "seed": s}) for s in range(draws)]
    tensors = SamplingTensors.from_params(rows, [0] * draws, CPU)
    history = torch.zeros((draws, 0), dtype=torch.int64)
    with _static(monkeypatch):
        out = sample(row.expand(draws, vocab).contiguous(), tensors, history, torch.ones(draws))
    freq = torch.bincount(out.next_ids, minlength=vocab).double() / draws

    probs = _warped_probs(row, params)
    # E[TV] <= sqrt(2 support / (pi draws)) / 2 ~ 0.014 here, and TV moves by 1/draws per
    # draw: past 0.04 by chance is ~exp(-2 draws 0.026**2) ~ 1e-12 likely.
    assert 0.5 * (freq - probs).abs().sum() < 0.04
    # ... and the bound has the power to see the wrong distribution.
    wrong = _warped_probs(row, SamplingParams(do_sample=True))
    assert 0.5 * (wrong - probs).abs().sum() > 0.1


# --- on a GPU: the platform's own flag, CUDA's own sync check ----------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_nothing_waits_and_a_graph_holds_the_step():
    gpu = torch.device("cuda")
    params = _rows(list(KINDS), repetition_penalty=1.1, frequency_penalty=0.2)
    logits, expected_tensors, history, lens = _inputs(params, 5000)
    expected = sample(logits, expected_tensors, history, lens, TOP_N)
    inputs = [t.to(gpu) for t in (logits, history, lens)]
    evens, odds = torch.arange(0, len(params), 2), torch.arange(1, len(params), 2)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # raises on any call that makes the host wait
    try:
        full = SamplingTensors.from_params(params, [3] * len(params), gpu)
        # Rebuilt from its halves, back in the original order: index and concat on the way.
        halves = SamplingTensors.concat([full.index(evens), full.index(odds)])
        tensors = halves.index(torch.argsort(torch.cat([evens, odds])))
        eager = sample(inputs[0], tensors, *inputs[1:], TOP_N)
    finally:
        torch.cuda.set_sync_debug_mode("default")

    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sample(inputs[0], tensors, *inputs[1:], TOP_N)  # warm-up: kernels compiled, cached
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        captured = sample(inputs[0], tensors, *inputs[1:], TOP_N)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.next_ids, eager.next_ids)
    assert torch.equal(captured.top_ids, eager.top_ids)

    # Against the CPU's path: other kernels round otherwise, so a draw near a boundary may
    # differ; greedy rows may not.
    ids = eager.next_ids.cpu()
    greedy = ~expected_tensors.do_sample
    assert torch.equal(ids[greedy], expected.next_ids[greedy])
    same = ids == expected.next_ids
    print(f"GPU static vs CPU dynamic: {same.double().mean().item():.4f} of the ids equal")
    assert same.double().mean() > 0.9
    lp = eager.logprobs.cpu()
    torch.testing.assert_close(lp[same], expected.logprobs[same], rtol=0, atol=1e-4)
