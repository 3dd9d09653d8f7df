"""Chunked prefill: how a step's prompt budget is shared.

Every step runs one token for each decoding request and up to a budget of prompt tokens
(`decoding_budget` while any request decodes, max_batch_prefill_tokens when none does): first
for the requests of the running batch still in their prompt (oldest first), then for newly
admitted ones, the last of which may get only the start of its prompt. A long prompt thus never
stalls the running requests for more than one chunk's worth of compute, and decoding goes on in
the same forward pass.

Decode tokens do not count against the budget (vLLM's max_num_batched_tokens counts them):
the budget bounds what prompts add to a step, whatever the batch size, so prompts keep flowing
into a large running batch instead of waiting for it to shrink.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

from router.entry import Entry

# While requests decode, a step's prompt budget is prefill_chunk_tokens, grown when many prompt
# tokens are pending (a wave of arrivals, as when requests that started together end together)
# to drain them in about DRAIN_STEPS steps, up to MAX_GROWTH chunks. A step's cost is a fixed
# part (every weight read once, the decode rows) plus a part per prompt token, so fewer, larger
# chunks cut the wait of the wave's last request, which is what TTFT p99 measures; the cap keeps
# those steps' inter-token latency within a few decode steps. A lone arrival still gets one chunk.
# DRAIN_STEPS 4 was measured against 1, 3 and 8 (and 2 with an 8x cap; docs/benchmarks.md):
# fewer cut TTFT p99 further but pushed ITL p99 at c=16 past transformers'; 8 left TTFT p99 at
# 0.57x of transformers'.
DRAIN_STEPS = 4
MAX_GROWTH = 4
# Except when the requests waiting for their first token (queued, or admitted with a prompt not
# yet computed) are several and number more than WAITING_SHARE of those decoding (a lone arrival
# always gets the chunked budget above): then a step takes prompts up
# to max_batch_prefill_tokens. Its length is one long inter-token gap for each decoder, where
# chunks would keep every waiting request from its first token for several steps, which is
# most of a wave's TTFT p99 (a burst of 16 arrivals on an idle server: one step starts one, the
# next 9 of 128 tokens, and the last 6 waited four more chunked steps beside 10 decoders). The
# decoders lose nothing in throughput either way (the same prompt tokens are computed in fewer
# steps); only the gap is longer. 1/2 was measured against 1 (TGI's waiting_served_ratio is
# 1.2): the p128/o128 c=16 levels' TTFT p99 528 -> 451 and 567 -> 472 ms, the p64/o32 levels
# unchanged, ITL p99 at most 185 ms (p64 c=32, where transformers' is 560-740 ms).
WAITING_SHARE = 0.5


def decode_step_budget(chunk: int, max_prefill: int, pending_prompt_tokens: int) -> int:
    """Prompt tokens a step may add while requests decode."""
    wanted = math.ceil(pending_prompt_tokens / DRAIN_STEPS)
    return min(max_prefill, chunk * MAX_GROWTH, max(chunk, wanted))


class WaveBudget:
    """A wave's grown budget, held until its prompts are all computed. Recomputed from what is
    left at every step, it would shrink with the wave (a quarter of a smaller remainder each
    step: 228, 171, 128, 96, 72, 64... tokens were measured for 15 prompts of 64 tokens), and
    the wave's last prompts would wait twice DRAIN_STEPS steps or more."""

    def __init__(self) -> None:
        self.budget = 0

    def reset(self) -> None:
        self.budget = 0

    def step(self, chunk: int, max_prefill: int, pending: int) -> int:
        if pending == 0:
            self.reset()  # drained: the next arrival starts from one chunk
            return chunk
        self.budget = max(self.budget, decode_step_budget(chunk, max_prefill, pending))
        return self.budget


def decoding_budget(
    chunk: int,
    max_prefill: int,
    running: Sequence[Entry],
    waiting: Collection[Entry],
    wave: WaveBudget,
) -> int:
    """Prompt tokens this step may add, for the running batch and the queue as they stand
    (`wave`: the policy's, which holds a wave's budget from step to step)."""
    decoding = sum(1 for entry in running if entry.prompt_left == 0)
    if len(running) - decoding + len(waiting) > max(1, WAITING_SHARE * decoding):
        return max_prefill
    return wave.step(chunk, max_prefill, _pending(running, waiting, chunk))


def _pending(running: Iterable[Entry], waiting: Iterable[Entry], chunk: int) -> int:
    """Prompt tokens not computed yet, counted only as far as can change the budget (a long
    queue is not walked)."""
    enough = chunk * MAX_GROWTH * DRAIN_STEPS
    pending = 0
    for entry in running:
        pending += entry.prompt_left
    for entry in waiting:
        if pending >= enough:
            break
        pending += entry.request.input_length
    return pending


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
