"""Several sequences for one HTTP request: OpenAI's `n` choices of each prompt, the completions
route's `best_of` candidates (of which the `n` most likely are answered) and its several
prompts, TGI's `best_of`. Each sequence is an entry of its own in the queue, so the scheduler
batches them like any requests; they differ only in their seed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from router.entry import Entry, Finished
from router.errors import ValidationError
from router.generations import Generations
from router.handlers.common import submit, wait_finished
from router.request import ValidRequest

SEED_MODULUS = 2**64


def seeded(valid: ValidRequest, count: int) -> list[ValidRequest]:
    """`count` copies of the request, the i-th sampling with its seed + i: different samples,
    all reproducible from the one seed (given or drawn by the validator), the first the same
    as the request alone."""
    if count == 1:
        return [valid]
    seed = valid.sampling.seed
    return [
        dataclasses.replace(
            valid,
            sampling=dataclasses.replace(valid.sampling, seed=(seed + i) % SEED_MODULUS),
        )
        for i in range(count)
    ]


def logprob_sum(entry: Entry) -> float:
    """How likely the generated sequence was: what `best_of` ranks candidates by."""
    return sum(t.logprob for t in entry.tokens if t.logprob is not None)


def check_count(gens: Generations, count: int, asked: str) -> None:
    """A request's sequences all run at once: more than --max-concurrent-requests could never
    be admitted (a 422 naming the fields, not a 429 that retrying cannot cure)."""
    if count > gens.limit.limit:
        raise ValidationError(
            f"{asked} asks for {count} sequences; the server runs at most {gens.limit.limit} "
            "at once (--max-concurrent-requests)"
        )


@dataclass
class Submitted:
    """A request's entries: per prompt, its candidates (in seed order)."""

    candidates: list[list[Entry]]

    @property
    def entries(self) -> list[Entry]:
        return [e for group in self.candidates for e in group]

    @property
    def firsts(self) -> list[Entry]:
        """One entry per prompt (what usage counts prompts by)."""
        return [group[0] for group in self.candidates]

    def cancel(self) -> None:
        for entry in self.entries:
            if not entry.done:
                entry.cancel()

    async def finished(self) -> dict[int, Finished]:
        """Waits for every entry (by Entry.id); the first failure cancels the others and is
        raised."""
        entries = self.entries
        # Tasks of our own: gather leaves the others running when one raises, and a cancelled
        # entry sends no further event, so they would wait forever.
        waits = [asyncio.ensure_future(wait_finished(e)) for e in entries]
        try:
            results = await asyncio.gather(*waits)
        finally:
            self.cancel()
            for wait in waits:
                wait.cancel()
        return {e.id: f for e, f in zip(entries, results, strict=True)}


def submit_all(
    request: web.Request,
    prompts: Sequence[ValidRequest],
    candidates: int,
    received: float | None,
) -> Submitted:
    """Queues `candidates` seeded sequences of every prompt; the caller holds the permits. If
    one cannot be queued (its adapter began unloading meanwhile), none stays queued."""
    sent = Submitted([])
    try:
        for prompt in prompts:
            group: list[Entry] = []
            sent.candidates.append(group)
            for valid in seeded(prompt, candidates):
                group.append(submit(request, valid, received))
    except BaseException:
        sent.cancel()
        raise
    return sent


def most_likely(entries: Sequence[Entry], keep: int) -> list[Entry]:
    """The `keep` most likely of the candidates (all of them, in order, when keep covers them)."""
    if keep >= len(entries):
        return list(entries)
    return sorted(entries, key=logprob_sum, reverse=True)[:keep]
