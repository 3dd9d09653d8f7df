"""Chunked prefill: how a step's token budget is shared (vLLM's and TGI v3's rule).

Every step runs one token for each decoding request and spends what is left of
max_batch_prefill_tokens on prompts: first on the requests of the running batch that are still
in their prompt (oldest first), then on newly admitted ones, the last of which may get only the
start of its prompt. A long prompt thus never stalls the running requests for more than one
budget's worth of compute, and decoding goes on in the same forward pass.
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
    in_prompt = []
    for entry in running:
        if entry.prompt_left > 0:
            in_prompt.append(entry)
        else:
            budget -= 1  # its decode token
    for entry in in_prompt:
        n = max(0, min(entry.prompt_left, budget))
        chunks[entry.id] = n
        budget -= n
    return chunks, max(budget, 0)


def chunk_new(budget: int, entries: Iterable[Entry]) -> dict[int, int]:
    """First chunks of newly admitted requests, in admission order."""
    chunks = {}
    for entry in entries:
        n = max(0, min(entry.prompt_left, budget))
        chunks[entry.id] = n
        budget -= n
    return chunks
