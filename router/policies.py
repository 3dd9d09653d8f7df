"""Scheduling policies: what one scheduler step runs. The batcher (router/batcher.py) owns the
mechanics every policy shares (admission with KV blocks, the Prefill and Decode RPCs, results,
releasing and failing requests); a policy only decides, each step, which of them to use.

Two policies, chosen by --prefill-chunking:
- `ChunkedPolicy` (default, TGI v3): every step is one forward pass under the token budget of
  router/chunking.py: the running batch's decode tokens and prompt chunks, and the first chunks
  of newly admitted requests, which the Prefill RPC starts together with the running batch.
- `WholePromptPolicy` (--no-prefill-chunking, TGI v2): waiting requests are prefilled whole as a
  separate batch between decode steps, under TGI's waiting_served_ratio / max_waiting_tokens
  rules, and that batch joins the running one at the next Decode. It stays, behind the same
  interface, as the baseline the chunked policy is measured against (bench/, the scheduling
  tests) and for deployments tuned with TGI v2's flags.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

from router.chunking import WaveBudget, chunk_new, decoding_budget, share_budget

if TYPE_CHECKING:
    from router.batcher import Batcher


class SchedulingPolicy(Protocol):
    async def step(self, batcher: Batcher) -> None:
        """One step: the running batch (already pruned) advances, new requests may start."""


class ChunkedPolicy:
    def __init__(self) -> None:
        self.wave = WaveBudget()  # a wave of prompts' budget, held until it is drained

    async def step(self, batcher: Batcher) -> None:
        running = batcher.running
        members = [batcher.entries[rid] for rid in running.request_ids] if running else []
        cfg = batcher.config
        budget = cfg.max_batch_prefill_tokens
        # Nobody is stalled by a large prefill when nothing decodes.
        if cfg.prefill_chunk_tokens is not None and any(e.prompt_left == 0 for e in members):
            budget = decoding_budget(
                cfg.prefill_chunk_tokens, budget, members, batcher.queue, self.wave
            )
        else:
            self.wave.reset()
        chunks, budget = share_budget(budget, members)
        new = []
        if budget > 0 and len(batcher.queue):
            new = batcher.admit(budget, len(members), chunking=True)
            chunks.update(chunk_new(budget, new))
        if new:
            reason = "chunked" if running is not None else None
            batcher.running = await batcher.prefill(new, reason, cached=running, chunks=chunks)
        elif running is not None:
            batcher.running = await batcher.decode([running], chunks)
        else:
            batcher.fail_unfittable_head()


class WholePromptPolicy:
    def __init__(self) -> None:
        # TGI's `waiting_tokens`: decode steps since requests last joined, counted from 1.
        self.waiting_steps = 1

    async def step(self, batcher: Batcher) -> None:
        if batcher.running is None:
            entries = batcher.admit(batcher.config.max_batch_prefill_tokens, 0)
            if not entries:
                batcher.fail_unfittable_head()
                return
            batcher.running = await batcher.prefill(entries)
            self.waiting_steps = 1
            return
        batches = [batcher.running]
        if len(batcher.queue):
            new = await self._prefill_waiting(batcher, len(batcher.running.request_ids))
            if new is not None:
                batches.append(new)
        batcher.running = await batcher.decode(batches)
        self.waiting_steps += 1

    async def _prefill_waiting(self, batcher: Batcher, running_size: int):
        """TGI's rule for pausing the running batch to prefill waiting requests."""
        cfg = batcher.config
        if self.waiting_steps >= cfg.max_waiting_tokens:
            min_size = None  # waited long enough: take whatever fits
        else:
            # Interrupting decode for a prefill is only worth it for enough new requests.
            min_size = math.floor(running_size * cfg.waiting_served_ratio)
        entries = batcher.admit(cfg.max_batch_prefill_tokens, running_size, min_size=min_size)
        if not entries:
            return None
        self.waiting_steps = 1
        reason = "backpressure" if min_size is not None else "wait_exceeded"
        return await batcher.prefill(entries, concat_reason=reason)
