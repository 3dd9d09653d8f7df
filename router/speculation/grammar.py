"""Proposals for structured-output requests: only tokens their grammar allows, each with the
mask of what may follow it (Proposal.token_masks), as the shards need to sample after every
proposed position exactly as they would one step at a time.

Run off the event loop, like the step's own masks (router/batcher.py `_token_masks`): llguidance
releases the GIL, and a mask per proposed token is real work for a large vocabulary.
"""

from __future__ import annotations

from router.entry import Entry
from router.errors import RouterError

Checked = dict[int, tuple[list[int], list[bytes]]]


def check_drafts(
    drafts: list[tuple[Entry, list[int]]],
) -> tuple[Checked, list[tuple[Entry, RouterError]]]:
    """Each constrained request's draft cut at the first token its grammar refuses, with the
    masks after each kept token, by request id; and the requests whose grammar failed."""
    checked: Checked = {}
    failures: list[tuple[Entry, RouterError]] = []
    for entry, ids in drafts:
        assert entry.constraint is not None
        try:
            checked[entry.id] = entry.constraint.check_proposal(ids)
        except RouterError as err:
            failures.append((entry, err))
    return checked, failures
