"""shard.sampling: penalties, warpers vs transformers, seeded draws, logprobs, batching."""

from __future__ import annotations

import random

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from shard.sampling import random_hash, truncation
from shard.sampling import sampler as sampling
from shard.sampling.params import SamplingParams
from shard.sampling.sampler import SampleOutput, SamplingTensors, sample


def _logits(batch: int, vocab: int, *, scale: float = 3.0, seed: int = 0) -> torch.Tensor:
    """Random logits with a few boosted tokens, like a language model's."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, vocab, generator=g) * scale
    x[:, torch.randperm(vocab, generator=g)[:5]] += 2 * scale
    return x


def _run(
    logits: torch.Tensor,
    params: list[SamplingParams],
    *,
    history: torch.Tensor | None = None,
    lens: torch.Tensor | int = 7,
    top_n: int = 0,
    prompt_lens: list[int] | int = 0,
) -> SampleOutput:
    """prompt_lens: where each row's generated ids start in its history (0: all generated)."""
    batch = logits.shape[0]
    if history is None:
        history = torch.zeros((batch, 1), dtype=torch.int64)
    if isinstance(lens, int):
        lens = torch.full((batch,), lens, dtype=torch.int64)
    if isinstance(prompt_lens, int):
        prompt_lens = [prompt_lens] * batch
    tensors = SamplingTensors.from_params(params, prompt_lens, "cpu")
    return sample(logits, tensors, history, lens, top_n)


def _hf_warped(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """transformers' warpers on one row [V], in generate()'s order."""
    scores = row[None, :] / torch.tensor(p.temperature, dtype=torch.float32)
    if p.top_k > 0:
        scores = TopKLogitsWarper(p.top_k)(None, scores)
    if p.top_p < 1:
        scores = TopPLogitsWarper(p.top_p)(None, scores)
    if p.min_p > 0:
        scores = MinPLogitsWarper(p.min_p)(None, scores)
    if p.typical_p < 1:
        scores = TypicalLogitsWarper(p.typical_p)(None, scores)
    return scores[0]


def _kept(row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(row).nonzero().squeeze(1).tolist())


# --- counter-based hash ----------------------------------------------------------------------


def _fmix32_reference(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_fmix32_matches_murmur3_on_the_whole_word():
    rng = random.Random(0)
    words = [0, 1, 2**31 - 1, 2**31, 2**32 - 1] + [rng.getrandbits(32) for _ in range(2000)]
    got = random_hash.fmix32(torch.tensor(words, dtype=torch.int64)).tolist()
    assert got == [_fmix32_reference(w) for w in words]


def test_uniforms_stay_inside_the_open_interval():
    keys = torch.tensor([0, 2**32 - 1, 12345], dtype=torch.int64)[:, None]
    codes = random_hash.vocab_codes(50_000, torch.device("cpu"))
    u = random_hash.uniform(keys, codes)
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01
    assert torch.isfinite(random_hash.gumbel(keys, codes)).all()


def test_split_seed_takes_seeds_modulo_2_64():
    assert random_hash.split_seed(2**64 - 1) == (2**32 - 1, 2**32 - 1)
    assert random_hash.split_seed(2**64 + 5) == (5, 0)
    assert random_hash.split_seed(-1) == (2**32 - 1, 2**32 - 1)


# --- greedy and logprobs ---------------------------------------------------------------------


def test_greedy_is_the_exact_argmax_with_exact_logprobs():
    logits = _logits(4, 5000)
    before = logits.clone()
    out = _run(logits, [SamplingParams()] * 4, top_n=6)
    reference = torch.log_softmax(logits, dim=-1)
    assert torch.equal(out.next_ids, logits.argmax(-1))
    assert torch.equal(out.logprobs, reference.gather(1, out.next_ids[:, None]).squeeze(1))
    top_lp, top_ids = reference.topk(6, dim=-1)
    assert torch.equal(out.top_ids, top_ids) and torch.equal(out.top_logprobs, top_lp)
    assert torch.equal(logits, before)


def test_greedy_rows_stay_exact_next_to_sampled_rows():
    logits = _logits(4, 3000)
    before = logits.clone()
    params = [
        SamplingParams(),
        SamplingParams(do_sample=True, temperature=0.5, seed=1),
        SamplingParams(do_sample=True, top_p=0.8, temperature=1.7, seed=2),
        SamplingParams(),
    ]
    out = _run(logits, params, top_n=3)
    reference = torch.log_softmax(logits, dim=-1)
    for row in (0, 3):
        assert out.next_ids[row] == logits[row].argmax()
        assert out.logprobs[row] == reference[row, out.next_ids[row]]
        assert torch.equal(out.top_logprobs[row], reference[row].topk(3).values)
    assert torch.equal(logits, before)


def test_logprobs_of_sampled_rows_come_from_the_warped_distribution():
    logits = _logits(2, 2000)
    params = [
        SamplingParams(do_sample=True, temperature=0.6, seed=3),
        SamplingParams(do_sample=True, temperature=1.3, top_k=4, top_p=0.9, seed=4),
    ]
    out = _run(logits, params, top_n=8)
    for row, p in enumerate(params):
        reference = torch.log_softmax(_hf_warped(logits[row], p), dim=-1)
        torch.testing.assert_close(out.logprobs[row], reference[out.next_ids[row]])
        torch.testing.assert_close(out.top_logprobs[row], reference.topk(8).values)
        assert (out.top_logprobs[row][:-1] >= out.top_logprobs[row][1:]).all()
        assert out.next_ids[row].item() in _kept(reference)
    # top_k=4 (or fewer after top_p) keeps the rest out: they are listed with -inf.
    assert torch.isinf(out.top_logprobs[1, 4:]).all()
    assert len(set(out.top_ids[1].tolist())) == 8


# --- penalties -------------------------------------------------------------------------------


def _penalized_reference(
    row: torch.Tensor, prompt: list[int], generated: list[int], p: SamplingParams
) -> torch.Tensor:
    """vLLM's definitions, one token at a time: the logit bias, then repetition over prompt
    and generated ids, frequency and presence (OpenAI's) over the generated ids only."""
    out = row.clone()
    for token, bias in p.logit_bias:
        out[token] += bias
    for token in set(prompt + generated):
        value = out[token]
        out[token] = value * p.repetition_penalty if value < 0 else value / p.repetition_penalty
    for token in set(generated):
        out[token] -= p.frequency_penalty * generated.count(token) + p.presence_penalty
    return out


def test_logit_bias_and_penalties_match_a_per_row_reference():
    vocab = 300
    logits = _logits(7, vocab, scale=2.0, seed=1)
    g = torch.Generator().manual_seed(5)
    history = torch.randint(0, 40, (7, 24), generator=g)  # small ids: many repeats
    history[:, 20:] = -1  # padding may hold anything
    history[3, 10:] = 10**9
    history[1, 3] = vocab + 7  # no logit to penalize: ignored
    lens = torch.tensor([20, 20, 0, 10, 1, 20, 12])
    prompt_lens = [8, 5, 0, 10, 1, 20, 3]  # row 3 and 5: no generated ids yet
    params = [
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(repetition_penalty=0.8, frequency_penalty=0.4, presence_penalty=0.3),
        SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0),  # empty history
        SamplingParams(frequency_penalty=-0.5, presence_penalty=1.5),
        SamplingParams(),
        SamplingParams(frequency_penalty=2.0, presence_penalty=2.0, logit_bias=((0, -100.0),)),
        SamplingParams(presence_penalty=-1.0, logit_bias=((3, 5.0), (17, -2.5), (299, 100.0))),
    ]
    out = _run(logits, params, history=history, lens=lens, top_n=vocab, prompt_lens=prompt_lens)
    for row, p in enumerate(params):
        ids = history[row, : lens[row]].tolist()
        prompt = [t for t in ids[: prompt_lens[row]] if t < vocab]
        generated = [t for t in ids[prompt_lens[row] :] if t < vocab]
        ref = _penalized_reference(logits[row], prompt, generated, p)
        ref_lp = torch.log_softmax(ref, dim=-1)
        got = torch.empty(vocab).scatter_(0, out.top_ids[row], out.top_logprobs[row])
        torch.testing.assert_close(got, ref_lp, atol=1e-5, rtol=0)
        assert out.next_ids[row] == ref.argmax()


def test_penalties_apply_to_sampled_rows_before_the_warpers():
    logits = torch.tensor([[0.5, 0.4, 5.0, 0.3, 0.2, 0.1]])
    history = torch.tensor([[2, 2, 2]])
    params = [SamplingParams(do_sample=True, top_k=3, frequency_penalty=3.0, seed=0)]
    out = _run(logits, params, history=history, lens=3, top_n=6)
    # 5 - 3 * 3 = -4: token 2 falls out of the top 3.
    assert out.top_ids[0, :3].tolist() == [0, 1, 3]
    assert torch.isinf(out.top_logprobs[0, 3:]).all()


@pytest.mark.parametrize("penalty", [1e-45, 1e-38, 3.4e38])
@pytest.mark.parametrize(
    "warpers", [{}, {"temperature": 1e-5}, {"temperature": 1e-5, "top_p": 0.5}]
)
def test_extreme_repetition_penalties_saturate_instead_of_making_nan(penalty, warpers):
    # The router allows any positive float32 penalty and temperatures down to 1e-5: a logit
    # divided by 1e-45 (or a negative one times 3.4e38) would be inf, and its row NaN.
    logits = _logits(3, 300)
    history = torch.tensor([[4, 9, 17]] * 3)
    params = [SamplingParams(do_sample=True, seed=1, repetition_penalty=penalty, **warpers)] * 3
    out = _run(logits, params, history=history, lens=3, top_n=4)
    assert torch.isfinite(out.logprobs).all() and not torch.isnan(out.top_logprobs).any()
    in_history = {4, 9, 17}
    for row in range(3):
        positive = {t for t in in_history if logits[row, t] > 0}
        if penalty < 1 and positive:  # boosted past every other token
            assert out.next_ids[row].item() in positive
        if penalty > 1:  # pushed below every other token
            assert not set(out.top_ids[row].tolist()) & in_history
    assert any(logits[row, t] > 0 for row in range(3) for t in in_history)  # a case to see


# --- warpers vs transformers -----------------------------------------------------------------

WARPER_CASES = [
    SamplingParams(do_sample=True, top_k=1),
    SamplingParams(do_sample=True, top_k=10),
    SamplingParams(do_sample=True, top_k=300),  # wider than the first candidate set
    SamplingParams(do_sample=True, top_p=0.5),
    SamplingParams(do_sample=True, top_p=0.9),
    SamplingParams(do_sample=True, top_p=0.999),  # nucleus past the candidates when flat
    SamplingParams(do_sample=True, typical_p=0.3),
    SamplingParams(do_sample=True, typical_p=0.9),
    SamplingParams(do_sample=True, typical_p=0.99),
    SamplingParams(do_sample=True, temperature=0.5, top_p=0.8),
    SamplingParams(do_sample=True, temperature=2.0, top_k=50, top_p=0.9, typical_p=0.9),
    SamplingParams(do_sample=True, top_k=20, typical_p=0.5),
    SamplingParams(do_sample=True, temperature=1.5, top_p=0.7, typical_p=0.95),
    SamplingParams(do_sample=True, min_p=0.05),
    SamplingParams(do_sample=True, min_p=1e-4),  # past the candidates when flat
    SamplingParams(do_sample=True, min_p=1.0),  # the most likely token alone
    SamplingParams(do_sample=True, temperature=1.5, top_k=100, min_p=0.1),
    SamplingParams(do_sample=True, top_p=0.9, min_p=0.2, typical_p=0.9),
    SamplingParams(do_sample=True, temperature=0.7),  # no truncation at all
]


def _groups(logits: torch.Tensor, params: list[SamplingParams], min_width: int = 0):
    t = SamplingTensors.from_params(params, [0] * len(params), "cpu")
    warpers = truncation.Warpers(t.temperature, t.top_k, t.top_p, t.typical_p, t.min_p)
    return list(
        truncation.candidate_groups(
            logits,
            warpers,
            top_k=t.flags.any_top_k,
            top_p=t.flags.any_top_p,
            typical=t.flags.any_typical,
            min_p=t.flags.any_min_p,
            min_width=min_width,
        )
    )


@pytest.mark.parametrize("scale", [0.3, 1.0, 3.0], ids=["flat", "medium", "peaked"])
def test_truncation_keeps_the_same_tokens_as_transformers(scale):
    vocab = 3000
    logits = _logits(len(WARPER_CASES), vocab, scale=scale, seed=2)
    groups = _groups(logits, WARPER_CASES)
    assert sorted(r for g in groups for r in g.rows.tolist()) == list(range(len(WARPER_CASES)))
    for group in groups:
        lse = group.logits.logsumexp(dim=1, keepdim=True)
        for i, row in enumerate(group.rows.tolist()):
            reference = _hf_warped(logits[row], WARPER_CASES[row])
            kept = torch.isfinite(group.logits[i])
            assert set(group.ids[i][kept].tolist()) == _kept(reference), WARPER_CASES[row]
            torch.testing.assert_close(
                (group.logits[i] - lse[i])[kept],
                torch.log_softmax(reference, dim=-1)[group.ids[i][kept]],
            )
    if scale == 0.3:  # the flat rows with wide nuclei needed more than the first candidates
        assert max(g.logits.shape[1] for g in groups) > truncation.CANDIDATES


def test_top_k_keeps_ties_past_the_first_candidates():
    vocab = 3000
    logits = torch.randn(1, vocab) - 10
    logits[0, :3] = torch.tensor([5.0, 4.0, 3.0])
    logits[0, 100:900] = 2.0  # the 4th largest value, tied 800 times
    p = SamplingParams(do_sample=True, top_k=4)
    (group,) = _groups(logits, [p])
    kept = set(group.ids[0][torch.isfinite(group.logits[0])].tolist())
    assert kept == _kept(_hf_warped(logits[0], p)) and len(kept) == 803


def test_sampled_tokens_are_always_in_the_transformers_set():
    vocab, draws = 1500, 200
    logits = _logits(1, vocab, scale=1.0, seed=3).expand(draws, vocab).contiguous()
    for p in WARPER_CASES[:-1]:
        params = [SamplingParams(**{**p.__dict__, "seed": s}) for s in range(draws)]
        out = _run(logits, params)
        assert set(out.next_ids.tolist()) <= _kept(_hf_warped(logits[0], p)), p


# --- the draws are distributed right ---------------------------------------------------------


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over the tokens with nonzero probability, and its degrees of
    freedom; counts outside them fail the test directly."""
    support = probs > 0
    assert counts[~support].sum() == 0, "drew a token the warpers removed"
    expected = probs[support] * counts.sum()
    stat = ((counts[support] - expected) ** 2 / expected).sum().item()
    return stat, int(support.sum()) - 1


def _limit(dof: int) -> float:
    # mean + 5 standard deviations of a chi-square: a false alarm is ~1e-5 likely.
    return dof + 5 * (2 * dof) ** 0.5 + 5


DISTRIBUTION_CASES = [
    SamplingParams(do_sample=True, temperature=0.7, top_k=8, top_p=0.9),
    SamplingParams(do_sample=True, temperature=2.0),
    SamplingParams(do_sample=True, temperature=1.5, typical_p=0.8),
    SamplingParams(do_sample=True, temperature=0.5, top_p=0.95, repetition_penalty=1.5),
    SamplingParams(do_sample=True, temperature=1.2, min_p=0.05),
]


@pytest.mark.parametrize("vary", ["seed", "step"])
@pytest.mark.parametrize("case", range(len(DISTRIBUTION_CASES)))
@pytest.mark.parametrize(
    ("head_size", "tail_block"),
    [(128, 256), (3, 256), (3, 5)],
    ids=["head", "tail", "tail-in-blocks"],
)
def test_draws_follow_the_warped_softmax(case, vary, head_size, tail_block, monkeypatch):
    monkeypatch.setattr(sampling, "HEAD_SIZE", head_size)  # 3: the tail path runs most draws
    # 5: the tail's inversion goes through 4 blocks, the last one padded.
    monkeypatch.setattr(sampling, "TAIL_BLOCK", tail_block)
    p = DISTRIBUTION_CASES[case]
    draws, vocab = 20_000, 16
    order = torch.randperm(vocab, generator=torch.Generator().manual_seed(case))
    row = torch.linspace(-2, 2.5, vocab)[order]
    history = torch.tensor([[3, 5]]).expand(draws, 2)
    if vary == "seed":
        params = [SamplingParams(**{**p.__dict__, "seed": s}) for s in range(draws)]
        lens = torch.full((draws,), 2)
    else:
        params = [SamplingParams(**{**p.__dict__, "seed": 1234})] * draws
        lens = torch.arange(2, draws + 2)  # every row another step of one request
    out = _run(row.expand(draws, vocab).contiguous(), params, history=history, lens=lens)
    counts = torch.bincount(out.next_ids, minlength=vocab).double()

    penalized = _penalized_reference(row, [3, 5], [], p)
    probs = torch.softmax(_hf_warped(penalized, p), dim=-1).double()
    stat, dof = _chi_square(counts, probs)
    assert stat < _limit(dof), (stat, dof)

    # The test has the power to see a missing temperature.
    untempered_params = SamplingParams(**{**p.__dict__, "temperature": 1.0})
    untempered = torch.softmax(_hf_warped(penalized, untempered_params), dim=-1)
    if (untempered > 0).equal(probs > 0):
        assert _chi_square(counts, untempered.double())[0] > 10 * _limit(dof)


# --- reproducibility -------------------------------------------------------------------------

MIXED = [
    SamplingParams(do_sample=True, seed=11),  # flat: mostly drawn from the tail
    SamplingParams(do_sample=True, temperature=0.8, seed=12, repetition_penalty=1.2),
    SamplingParams(do_sample=True, top_k=40, seed=13, frequency_penalty=0.5),
    SamplingParams(do_sample=True, top_p=0.9, temperature=1.3, seed=14),
    SamplingParams(do_sample=True, typical_p=0.7, seed=2**64 - 1),
    SamplingParams(do_sample=True, top_p=0.999, seed=16),  # needs the widest candidates
    SamplingParams(repetition_penalty=1.3),
]


def _mixed_inputs(vocab: int = 4000):
    logits = _logits(len(MIXED), vocab, scale=0.5, seed=4)
    g = torch.Generator().manual_seed(6)
    history = torch.randint(0, vocab, (len(MIXED), 12), generator=g)
    lens = torch.arange(5, 5 + len(MIXED))
    return logits, history, lens


def test_same_seed_same_token_whatever_the_batch():
    logits, history, lens = _mixed_inputs()
    full = _run(logits, MIXED, history=history, lens=lens, top_n=4)
    again = _run(logits, MIXED, history=history, lens=lens, top_n=4)
    assert torch.equal(full.next_ids, again.next_ids)

    order = [5, 2, 0, 6, 3, 1, 4]
    strangers = [SamplingParams(do_sample=True, top_k=1000, seed=99), SamplingParams()]
    mixed_logits = torch.cat([logits[order], _logits(2, logits.shape[1], seed=9)])
    mixed_params = [MIXED[i] for i in order] + strangers
    mixed_history = torch.cat([history[order], history[:2]])
    mixed_lens = torch.cat([lens[order], lens[:2]])
    shuffled = _run(mixed_logits, mixed_params, history=mixed_history, lens=mixed_lens, top_n=4)
    for position, row in enumerate(order):
        assert shuffled.next_ids[position] == full.next_ids[row]
        torch.testing.assert_close(shuffled.logprobs[position], full.logprobs[row])
        assert torch.equal(shuffled.top_ids[position], full.top_ids[row])


def test_heterogeneous_batch_equals_each_row_alone():
    params = [
        SamplingParams(repetition_penalty=1.5),
        SamplingParams(do_sample=True, temperature=0.8, seed=1),
        SamplingParams(
            do_sample=True, top_k=40, repetition_penalty=1.2, frequency_penalty=0.3, seed=2
        ),
        SamplingParams(do_sample=True, top_p=0.9, temperature=1.3, seed=3),
        SamplingParams(do_sample=True, typical_p=0.7, seed=4),
    ]
    vocab = 3000
    logits = _logits(5, vocab, scale=1.0, seed=7)
    history = torch.randint(0, vocab, (5, 10), generator=torch.Generator().manual_seed(8))
    lens = torch.tensor([10, 9, 8, 7, 6])
    batch = _run(logits, params, history=history, lens=lens, top_n=5)
    for row, p in enumerate(params):
        one = slice(row, row + 1)
        alone = _run(logits[one], [p], history=history[one], lens=lens[one], top_n=5)
        assert batch.next_ids[row] == alone.next_ids[0]
        torch.testing.assert_close(batch.logprobs[row], alone.logprobs[0])
        assert torch.equal(batch.top_ids[row], alone.top_ids[0])
        torch.testing.assert_close(batch.top_logprobs[row], alone.top_logprobs[0])


def test_different_seeds_and_steps_draw_different_tokens():
    vocab, rows = 1000, 64
    logits = _logits(1, vocab, scale=0.2).expand(rows, vocab).contiguous()
    by_seed = _run(logits, [SamplingParams(do_sample=True, seed=s) for s in range(rows)])
    assert len(set(by_seed.next_ids.tolist())) > 50
    steps = torch.arange(rows) + 1
    by_step = _run(logits, [SamplingParams(do_sample=True, seed=5)] * rows, lens=steps)
    assert len(set(by_step.next_ids.tolist())) > 50
    # The high word of the seed counts too.
    high = _run(logits, [SamplingParams(do_sample=True, seed=s << 32) for s in range(1, rows + 1)])
    assert len(set(high.next_ids.tolist())) > 50


# --- SamplingTensors -------------------------------------------------------------------------

BATCH_A = [
    SamplingParams(),
    SamplingParams(do_sample=True, top_k=5, seed=3, logit_bias=((4, 1.0), (9, -2.0))),
    SamplingParams(repetition_penalty=1.1),
]
BATCH_B = [
    SamplingParams(do_sample=True, temperature=0.5, seed=2**63 + 7),
    SamplingParams(logit_bias=((0, 0.5),)),
    SamplingParams(do_sample=True, typical_p=0.5, frequency_penalty=0.2),
    SamplingParams(do_sample=True, top_k=70, top_p=0.9),
]


def _assert_same(a: SamplingTensors, b: SamplingTensors) -> None:
    """Equal rows; bias columns past `b`'s width (rows that left) hold only padding."""
    assert a.flags == b.flags
    for name, value in a.__dict__.items():
        if name in ("bias_ids", "bias_values"):
            width = getattr(b, name).shape[1]
            assert not value[:, width:].any(), name
            value = value[:, :width]
        if name != "flags":
            assert torch.equal(value, getattr(b, name)), name


def _tensors(params: list[SamplingParams]) -> SamplingTensors:
    return SamplingTensors.from_params(params, [3] * len(params), "cpu")


def test_concat_equals_building_the_joined_batch():
    joined = SamplingTensors.concat([_tensors(BATCH_A), _tensors(BATCH_B)])
    _assert_same(joined, _tensors(BATCH_A + BATCH_B))
    _assert_same(SamplingTensors.concat([_tensors(BATCH_B)]), _tensors(BATCH_B))
    assert joined.dense_rows.tolist() == [0, 2, 3, 4] and joined.dense_sampled.tolist() == [2]
    assert joined.truncated_rows.tolist() == [1, 5, 6]


def test_index_equals_building_the_kept_rows():
    params = BATCH_A + BATCH_B
    full = _tensors(params)
    keep = [6, 0, 3]
    _assert_same(full.index(torch.tensor(keep)), _tensors([params[i] for i in keep]))
    mask = torch.tensor([True, False, True, False, True, False, False])
    _assert_same(full.index(mask), _tensors([params[0], params[2], params[4]]))
    assert full.index(mask).flags.max_top_k == 0 and not full.index(mask).flags.any_temperature
    assert full.flags.any_logit_bias and not full.index(torch.tensor([0, 2])).flags.any_logit_bias
    assert len(full.index(torch.tensor([], dtype=torch.int64))) == 0


def test_flags_follow_float32_and_greedy_rows():
    t = _tensors(
        [
            SamplingParams(top_k=9, temperature=0.0, top_p=0.0),  # greedy: warpers ignored
            SamplingParams(do_sample=True, top_p=1 - 1e-9),  # 1.0 in float32
        ]
    )
    assert not (t.flags.any_top_k or t.flags.any_top_p or t.flags.any_temperature)
    assert t.truncated_rows.numel() == 0


def test_empty_batch():
    out = _run(torch.zeros(0, 10), [], top_n=3)
    assert out.next_ids.shape == (0,) and out.top_ids.shape == (0, 3)
