"""Chunked prefill: how a step's prompt budget is shared.

Every step runs one token for each decoding request and up to a budget of prompt tokens
(prefill_chunk_tokens while any request decodes, max_batch_prefill_tokens when none does): first
for the requests of the running batch still in their prompt (oldest first), then for newly
admitted ones, the last of which may get only the start of its prompt. A long prompt thus never
stalls the running requests for more than one chunk's worth of compute, and decoding goes on in
the same forward pass.

Decode tokens do not count against the budget (vLLM's max_num_batched_tokens counts them):
the budget bounds what prompts add to a step, whatever the batch size, so prompts keep flowing
into a large running batch instead of waiting for it to shrink.
"""

from __future__ import annotations

from collections.abc import Iterable

from router.entry import Entry


def share_budget(budget: int, running: Iterable[Entry]) -> tuple[dict[int, int], int]:
    """Chunks for the running batch's requests still in their prompt, and the budget left.

    Requests in their prompt get an explicit 0 once the budget is spent: shards compute the
    whole rest of a prompt that has no chunk.
    """
    chunks: dict[int, int] = {}
    for entry in running:
        if entry.prompt_left > 0:
            n = max(0, min(entry.prompt_left, budget))
            chunks[entry.id] = n
            budget -= n
    return chunks, budget


def chunk_new(budget: int, entries: Iterable[Entry]) -> dict[int, int]:
    """First chunks of newly admitted requests, in admission order."""
    chunks = {}
    for entry in entries:
        n = max(0, min(entry.prompt_left, budget))
        chunks[entry.id] = n
        budget -= n
    return chunks
