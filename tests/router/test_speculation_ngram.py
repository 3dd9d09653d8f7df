"""Prompt lookup proposals: the incremental proposer against a brute-force scan of the whole
sequence, fed the way the router feeds it (a prompt, then tokens one or several at a time)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.speculation.ngram import NgramProposer


def brute_force(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """For n = max_n .. min_n: the last n tokens' most recent earlier occurrence (ending before
    the end of the sequence), and the up to k tokens that followed it."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n :]
        for end in range(length - 1, n - 1, -1):
            if tokens[end - n : end] == suffix:
                return tokens[end : end + k]
    return []


def test_examples():
    p = NgramProposer(1, 3)
    p.extend([1, 2, 3, 4, 1, 2])
    assert p.propose(3) == [3, 4, 1]  # "1 2" followed by "3 4 1" earlier
    p.extend([3])
    assert p.propose(5) == [4, 1, 2, 3]  # "1 2 3": the run overlaps the suffix itself
    p.extend([9])
    assert p.propose(5) == []  # 9 never occurred before
    p.extend([9])
    assert p.propose(2) == [9]  # "9" at the end, most recent earlier one at index 6
    assert p.propose(0) == []
    q = NgramProposer(2, 2)
    q.extend([5, 6, 7, 5, 6, 8, 5, 6])
    assert q.propose(2) == [8, 5]  # the most recent of two earlier occurrences


@settings(max_examples=300, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 3), max_size=30),
    steps=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), max_size=12),
    window=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    k=st.integers(1, 6),
)
def test_incremental_equals_brute_force(prompt, steps, window, k):
    min_n, max_n = window[0], window[0] + window[1]
    proposer = NgramProposer(min_n, max_n)
    proposer.extend(prompt)
    tokens = list(prompt)
    assert proposer.propose(k) == brute_force(tokens, k, min_n, max_n)
    for step in steps:
        proposer.extend(step)
        tokens += step
        assert proposer.propose(k) == brute_force(tokens, k, min_n, max_n), tokens
    assert proposer.tokens == tokens
