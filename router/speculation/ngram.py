"""Prompt lookup (n-gram) proposals for one request (vLLM's "ngram" method, TGI's --speculate).

When the last n tokens of a request's sequence (prompt + generated) occurred earlier in it, the
tokens that followed that occurrence are a cheap guess at what comes next: code edits, quotes,
summaries, JSON that repeats keys all copy long runs from their context. No model runs for it.

Incremental: the proposer is fed the prompt once and then each generated token, and keeps for
every window size n a dictionary from each n-gram to the end of its most recent occurrence
*before* the current end of the sequence. A proposal is then one lookup per window size,
longest first, never a scan of the sequence: the sequence can be a 100k-token prompt, and the
router proposes for every decoding request at every step.
"""

from __future__ import annotations

from collections.abc import Iterable


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        # n -> {n-gram: end (exclusive) of its latest occurrence that some token follows}. The
        # n-gram ending at the sequence's end is left out until a token follows it: it is what a
        # proposal looks up, and its own occurrence proposes nothing.
        self._ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, ids: Iterable[int]) -> None:
        """Appends tokens: the whole prompt at once, or each step's generated tokens."""
        toks = self.tokens
        start = len(toks)
        toks.extend(ids)
        end = len(toks)
        if end == start:
            return
        for n, ends in self._ends.items():
            # The n-grams that now have a token after them end at e in [start, end - 1]
            # (exclusive ends); one that ended exactly at `start` was the old last n-gram.
            first = max(n, start)
            if first > end - 1:
                continue
            grams = zip(*(toks[first - n + i : end - n + i] for i in range(n)), strict=True)
            # update() keeps the last value of a repeated key: the most recent occurrence.
            ends.update(zip(grams, range(first, end), strict=True))

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier occurrence of the longest
        matching suffix (window sizes max_n down to min_n); none without a match."""
        toks = self.tokens
        length = len(toks)
        if k <= 0:
            return []
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            end = self._ends[n].get(tuple(toks[length - n :]))
            if end is not None:
                return toks[end : end + k]
        return []
