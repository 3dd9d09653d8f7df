"""The waiting queue: FIFO admission under token budgets and KV block availability.

Admission is first-come first-served: when the head does not fit the token budgets or the KV
cache, nothing behind it jumps ahead (a large request would otherwise starve). A request whose
LoRA adapter finds no free device slot is skipped instead, and waits for the slot a draining
adapter frees (router/adapters.py: AdmissionGate). Entries get their KV reservation here, at
admission, for their whole life (prompt + max_new_tokens), starting with the cached blocks of
their prompt's prefix when the prefix cache holds some (router/prefix_cache.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator

from router.adapters import AdmissionGate
from router.block_allocator import BlockAllocator
from router.entry import Entry
from router.errors import RouterError
from router.prefix_cache import reusable_prompt


class Queue:
    def __init__(self) -> None:
        self._entries: deque[Entry] = deque()
        self._arrived = asyncio.Event()
        # Set once nothing more can be served (the shards are lost): new requests get it.
        self.closed: RouterError | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def append(self, entry: Entry) -> None:
        if self.closed is not None:
            raise self.closed
        self._entries.append(entry)
        self._arrived.set()

    async def wait(self) -> None:
        """Returns once the queue holds at least one entry."""
        while not self._entries:
            self._arrived.clear()
            await self._arrived.wait()

    def drop_gone(self) -> list[Entry]:
        """Removes entries whose client went away (they hold no blocks yet)."""
        keep: deque[Entry] = deque()
        gone: list[Entry] = []
        for entry in self._entries:
            (gone if entry.gone else keep).append(entry)
        for entry in gone:
            entry.done = True
        self._entries = keep
        return gone

    def pop_head(self) -> Entry:
        return self._entries.popleft()

    def drain(self) -> list[Entry]:
        entries = list(self._entries)
        self._entries.clear()
        return entries

    def next_batch(
        self,
        allocator: BlockAllocator,
        *,
        prefill_token_budget: int,
        token_budget: int,
        min_size: int | None = None,
        max_size: int | None = None,
        chunking: bool = False,
        adapters: AdmissionGate | None = None,
    ) -> list[Entry]:
        """Takes the longest FIFO prefix that fits, less the requests whose adapter finds no
        slot; empty when fewer than min_size fit.

        token_budget bounds prompt + max_new_tokens over the new entries (what the running
        batch leaves of max_batch_total_tokens); prefill_token_budget bounds their prompts
        (with chunking, what is computed this step: the last entry may start with a part of its
        prompt); max_size bounds their number (what the running batch leaves of max_batch_size);
        `adapters` bounds the distinct LoRA adapters live on the shards (--max-loras).
        """
        batch: list[Entry] = []
        prefill_tokens = 0
        total_tokens = 0
        for entry in self._entries:
            if max_size is not None and len(batch) >= max_size:
                break
            req = entry.request
            # Cached prefix blocks are neither computed nor, when running requests hold them
            # already, counted again against the batch token budget. A longrope request that
            # may grow past the boundary gets none and keeps its blocks private: the shards
            # recompute it whole at the crossing. That step costs the shards a prefill of the
            # boundary's length once per such request (as it costs transformers), which the
            # budgets here and in the policy see as a one-token decode.
            match = allocator.match(
                reusable_prompt(req), req.adapter_id, req.input_length, req.total_tokens
            )
            to_compute = req.input_length - len(match.blocks) * allocator.block_size
            cost = req.total_tokens - allocator.shared_by(match)
            if chunking:
                if prefill_tokens >= prefill_token_budget:
                    break
            elif prefill_tokens + to_compute > prefill_token_budget:
                break
            if total_tokens + cost > token_budget:
                break
            if adapters is not None and not adapters.admit(req.adapter_id):
                continue  # no slot for its adapter yet: the gate drains one for it
            allocation = allocator.allocate(req.total_tokens, match)
            if allocation is None:
                break
            entry.allocation = allocation
            entry.prompt_done = entry.cached_tokens = allocation.cached_tokens
            batch.append(entry)
            prefill_tokens += to_compute
            total_tokens += cost
        if not batch or (min_size is not None and len(batch) < min_size):
            # Not worth interrupting the running batch for: give the reservations back.
            for entry in batch:
                assert entry.allocation is not None
                allocator.free(entry.allocation.blocks)
                entry.allocation = None
                entry.prompt_done = entry.cached_tokens = 0
            return []
        admitted = {id(entry) for entry in batch}
        self._entries = deque(e for e in self._entries if id(e) not in admitted)
        return batch
