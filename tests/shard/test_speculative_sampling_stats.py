"""Speculative sampling is distributed as the target (shard/speculation.py): a sampled row that
verifies a proposal emits, at every position, tokens drawn from the model's own distribution.

The shard samples at each of a verifying row's positions as one step at a time would, and
keeps the samples up to the first that differs from the proposal: rejection sampling with a
deterministic proposal (q one-hot at d), which accepts d with probability p(d) and otherwise
emits a token distributed as p without d, renormalised. Together: the emitted token is
distributed as p. That holds only if the accept probability is p(d), the rejected token never
is d, and each position draws its own random numbers; test_speculative_verify.py shows that the
tokens equal those of steps one at a time for a few seeds, this shows the distribution over
many.

Many differently seeded requests (each a row of one batch, so a round is one Prefill and one
Decode) first sample a token after their prompt, then verify [d1, d2] in one Decode: d1 the
most likely token after that context, d2 the most likely after d1, so that both accepting and
rejecting are frequent. transformers computes every row's exact distributions at the three
positions the step samples (after the context, after d1, after d1 d2); the emitted tokens at
each position, among the rows that got that far, are compared with them by a chi-square test
over the tokens' ranks (each row's most likely token, its second, ..., the rest pooled), and
the number of accepted proposals with its expectation.

The rows' contexts differ (their first tokens were sampled), so a category's count is a sum of
Bernoulli variables of different means; the Pearson statistic against the summed expectations
is then at most as spread as chi-square with (categories - 1) degrees of freedom, so its
p-value is conservative. Each position must also draw its own random numbers: with the first
position's, the token that won it would win again more often than the target says, so the rows
whose next token repeats the proposal just accepted are counted against their expectation.

The seeds are fixed, so the test is deterministic; the thresholds (p > 1e-6, within 5 standard
deviations) are loose enough that a change in the kernels' rounding, which redraws a few tokens,
does not flip them (correct sampling gives p-values of 0.2-0.7 and |z| < 1 here), and tight
enough for the broken variants it was checked against (monkeypatched in a scratch run; the
worse of the two cases): the rejected token drawn from p with d left in (p ~ 1e-102,
acceptance z ~ 25), an accept probability of p(d)^2 (p ~ 1e-100, z ~ -25) or of 1.2 p(d)
(p ~ 1e-12, z ~ 8), every position drawing with the first position's random numbers (repeats
z ~ 7).
"""

from __future__ import annotations

import math

import pytest
import torch

from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import (
    BlockPool,
    FakeContext,
    chooser_params,
    run,
    start_warm_service,
)

ROWS = 512  # requests per round: one batch
ROUNDS = 6
PROMPT_LEN = 8
MAX_NEW = 4  # room for the first token and a proposal of two
PROPOSED = 2
# A conservative chi-square threshold (see the module docstring), and for the accepted counts a
# bound in standard deviations of the same order.
MIN_P_VALUE = 1e-6
MAX_SIGMAS = 5.0
# A category of the chi-square test expects at least this many rows.
MIN_EXPECTED = 5.0

# Random-weight models are nearly uniform at temperature 1 (the tiny Llama's most likely token
# has p ~ 0.01); lower temperatures make the most likely token likely (p ~ 0.2-0.9), so that
# both branches of the verification are frequent. The truncated case runs the sampler's top-k
# path (shard/sampling/truncation.py).
CASES = {
    "dense": dict(temperature=0.15, top_k=0),
    "top_k": dict(temperature=0.3, top_k=8),
}


@pytest.fixture(scope="module")
def svc(servicer_model_dir):
    return start_warm_service(servicer_model_dir, kv_tokens=16 * (ROWS + 8))


def _prompt(round_: int, row: int) -> list[int]:
    """Four prompts a round, so that rows start from a few different contexts."""
    variant = 4 * round_ + row % 4
    return [3 + (13 * variant + 7 * j) % 150 for j in range(PROMPT_LEN)]


def _target(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """The distribution the sampler draws from: softmax of the logits over the temperature,
    within the top_k largest (0: all)."""
    scores = logits.double() / temperature
    if top_k:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    return scores.softmax(-1)


def _serve_round(svc, round_: int, temperature: float, top_k: int, reference):
    """One round: ROWS requests prefilled together, each then verifying [d1, d2]. Returns the
    proposals [ROWS, 2], the target distributions at the three positions the Decode samples
    [ROWS, 3, V] and each row's emitted tokens."""
    pool = BlockPool(ROWS + 8, seed=round_)
    requests = []
    for row in range(ROWS):
        params = chooser_params(
            do_sample=True, temperature=temperature, top_k=top_k, seed=1000 * round_ + row + 1
        )
        requests.append(pool.request(row, _prompt(round_, row), MAX_NEW, parameters=params))
    prefill = run(
        svc.Prefill(pb.PrefillRequest(batch=pb.Batch(id=round_, requests=requests)), FakeContext())
    )
    first = {g.request_id: list(g.tokens.ids) for g in prefill.generations}
    assert all(len(t) == 1 for t in first.values())
    contexts = torch.tensor([_prompt(round_, row) + first[row] for row in range(ROWS)])

    with torch.no_grad():
        after_context = reference(contexts).logits[:, -1]
        d1 = _target(after_context, temperature, top_k).argmax(-1)
        after_d1 = reference(torch.cat([contexts, d1[:, None]], 1)).logits[:, -1]
        d2 = _target(after_d1, temperature, top_k).argmax(-1)
        proposed = torch.stack([d1, d2], 1)
        logits = reference(torch.cat([contexts, proposed], 1)).logits[:, -PROPOSED - 1 :]
    targets = _target(logits, temperature, top_k)

    proposals = {row: pb.Proposal(ids=proposed[row].tolist()) for row in range(ROWS)}
    decode = run(
        svc.Decode(pb.DecodeRequest(batches=[prefill.batch], proposals=proposals), FakeContext())
    )
    run(svc.ClearCache(pb.ClearCacheRequest(), FakeContext()))
    emitted = {g.request_id: list(g.tokens.ids) for g in decode.generations}
    assert sorted(emitted) == list(range(ROWS))
    return proposed, targets, [emitted[row] for row in range(ROWS)]


def _chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's statistic of observed against expected counts, and the chi-square
    (categories - 1) survival function at it (the regularized upper incomplete gamma)."""
    stat = ((observed - expected) ** 2 / expected).sum()
    df = torch.tensor(float(len(expected) - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


def _rank_categories(targets: torch.Tensor, tokens: torch.Tensor):
    """Observed and expected counts of the tokens' ranks under each row's distribution
    (targets [N, V], tokens [N]): one category per leading rank that expects MIN_EXPECTED rows
    or more, the rest pooled."""
    order = targets.argsort(dim=-1, descending=True, stable=True)
    ranks = (order == tokens[:, None]).int().argmax(-1)
    by_rank = targets.gather(-1, order).sum(0)  # expected rows at each rank, non-increasing
    kept = int((by_rank >= MIN_EXPECTED).sum())
    while kept > 1 and by_rank[kept:].sum() < MIN_EXPECTED:
        kept -= 1
    expected = torch.cat([by_rank[:kept], by_rank[kept:].sum()[None]])
    observed = torch.bincount(ranks.clamp(max=kept), minlength=kept + 1).double()
    return observed, expected


@pytest.mark.parametrize("case", sorted(CASES))
def test_verified_samples_are_distributed_as_the_target(svc, servicer_reference, case):
    temperature, top_k = CASES[case]["temperature"], CASES[case]["top_k"]
    proposed, targets, emitted = [], [], []
    for round_ in range(ROUNDS):
        p, t, e = _serve_round(svc, round_, temperature, top_k, servicer_reference)
        proposed.append(p)
        targets.append(t)
        emitted += e
    proposed, targets = torch.cat(proposed), torch.cat(targets)

    # Each answer: the accepted proposals, then one token that differs from the proposal (or
    # follows all of it).
    for row, tokens in enumerate(emitted):
        n = len(tokens) - 1
        assert tokens[:n] == proposed[row, :n].tolist(), row
        assert n == PROPOSED or tokens[n] != int(proposed[row, n]), row

    # Position j is reached by the rows that accepted d1..dj; there, the emitted token is
    # drawn from the target after the context and d1..dj.
    reached = torch.ones(len(emitted), dtype=torch.bool)
    repeats = torch.zeros(3, dtype=torch.float64)  # observed, expected, variance
    for j in range(PROPOSED + 1):
        rows = reached.nonzero().squeeze(1)
        tokens = torch.tensor([emitted[r][j] for r in rows.tolist()])
        target = targets[rows, j]
        observed, expected = _rank_categories(target, tokens)
        assert len(expected) >= 3, "too few rows to tell the distributions apart"
        p_value = _chi_square_p_value(observed, expected)
        assert p_value > MIN_P_VALUE, (j, p_value, observed.tolist(), expected.tolist())
        if j > 0:  # the token that won position j - 1 is no likelier here than p says
            p_repeat = target.gather(1, proposed[rows, j - 1, None]).squeeze(1)
            repeated = int((tokens == proposed[rows, j - 1]).sum())
            repeats += torch.stack(
                [torch.tensor(float(repeated), dtype=torch.float64), *_mean_var(p_repeat)]
            )
        if j == PROPOSED:
            break
        # Acceptance: d_{j+1} is accepted with probability p(d_{j+1}).
        p_accept = target.gather(1, proposed[rows, j, None]).squeeze(1)
        accepted = tokens == proposed[rows, j]
        mean, var = _mean_var(p_accept)
        assert abs(int(accepted.sum()) - mean) < MAX_SIGMAS * var.sqrt(), (j, accepted.sum(), mean)
        # Both branches were taken often (the test is about both).
        assert 0.15 < accepted.double().mean() < 0.85, (j, accepted.double().mean())
        reached[rows[~accepted]] = False
    assert int(reached.sum()) >= 100, "too few rows accepted the whole proposal"
    observed, mean, var = repeats
    assert abs(observed - mean) < MAX_SIGMAS * var.sqrt(), ("repeats", observed, mean)


def _mean_var(p: torch.Tensor) -> torch.Tensor:
    """Mean and variance of the number of successes among Bernoulli(p) variables (float64)."""
    return torch.stack([p.sum(), p.mul(1 - p).sum()]).double()
