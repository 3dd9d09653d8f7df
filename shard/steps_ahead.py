"""Overlap scheduling: the next decode step queued on the device before the router has read the
answer to the one before (vLLM's async scheduling, SGLang's overlap scheduler).

A decode step's one wait is the copy of its sampled tokens back (shard/runner.py). Between that
copy and the next Decode RPC, the device would idle while the answer travels to the router, the
router detokenizes, streams and checks stops, and its next RPC travels back. So once a step's
answer is ready, the servicer queues the next step of the same batch at once, when the host
can plan it alone: every row decoding (its input is the token just sampled, already in the
device history) and none constrained (a grammar's mask for the next token needs the router).
The answer goes out while the device computes.

The next RPC then takes the step's answers instead of running one:
- Decode, or Prefill with it as a cached batch: its rows' tokens are the step's; only the other
  batches run a step now (a request joining does not waste the step).
- FilterBatch: the kept rows' answers are kept; the dropped rows' tokens (past a stop, or a
  request cancelled) are never read, and the router frees their blocks, which the step wrote
  into before anything reuses them (the device runs in order).
- ClearCache: dropped.
A failure while queuing the step is kept and raised by the RPC that would read it, so a forward
pass that failed still fails a step the router asked for (and, with several shards, stops the
shard as any failed forward pass does).

On by default where the device runs apart from the host (`Platform.overlaps_steps`: CUDA); on a
CPU the "device" is the host, so a step queued ahead would delay the answer by a whole step.
Token ids are unchanged either way: the same step runs, only earlier.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from shard.batch import Batch
from shard.platforms import platform_of
from shard.runner import InFlight, ModelRunner
from shard.settings import ShardSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ahead:
    """A step queued ahead for a cached batch, or the error queuing it raised."""

    in_flight: InFlight | None
    error: Exception | None = None


def overlap_enabled(settings: ShardSettings, device: torch.device) -> bool:
    """--overlap-schedule: "auto" is the platform's choice, off with a draft model (its phase
    follows each step, shard/draft.py, so no step runs ahead of the router)."""
    if settings.draft_model is not None:
        return False
    if settings.overlap_schedule == "auto":
        return platform_of(device).overlaps_steps
    return settings.overlap_schedule == "on"


def can_run_ahead(batch: Batch) -> bool:
    """Whether the host can plan the batch's next step without the router: every row decodes
    (only its last known token lacks K/V), has a KV slot for that token (a row past its
    reservation is one the router stops) and needs no grammar's mask."""
    if not len(batch) or any(r.constrained for r in batch.requests):
        return False
    capacity = torch.tensor([r.capacity for r in batch.requests])
    decoding = batch.history_lens - batch.cache_lens == 1
    return bool((decoding & (batch.history_lens <= capacity)).all())


class StepsAhead:
    """The steps queued ahead, by cached batch id."""

    def __init__(self, runner: ModelRunner, enabled: bool) -> None:
        self.runner = runner
        self.enabled = enabled
        self.steps: dict[int, Ahead] = {}
        self.taken = 0  # steps whose answers a later RPC took (the tests count them)

    def launch(self, batch: Batch) -> None:
        """Queues `batch`'s next step when overlap is on and the host can plan it alone."""
        if not self.enabled or not can_run_ahead(batch):
            return
        try:
            self.steps[batch.id] = Ahead(self.runner.launch(batch))
        except Exception as err:  # raised by the RPC that would have read the step
            log.warning("queuing the next step of batch %d failed: %s", batch.id, err)
            self.steps[batch.id] = Ahead(None, err)

    def has(self, batch_id: int) -> bool:
        return batch_id in self.steps

    def take(self, batch: Batch):
        """The answers of `batch`'s step queued ahead (generations, timings)."""
        ahead = self.steps.pop(batch.id)
        if ahead.error is not None:
            raise ahead.error
        self.taken += 1
        return self.runner.finish(batch, ahead.in_flight)

    def filter(self, batch_id: int, new_id: int, rows: torch.Tensor) -> None:
        """FilterBatch kept `rows` (host indices) of batch `batch_id` as batch `new_id`."""
        ahead = self.steps.pop(batch_id, None)
        if ahead is None:
            return
        if ahead.in_flight is not None:
            ahead = Ahead(ahead.in_flight.keep(rows))
        self.steps[new_id] = ahead

    def drop(self, batch_id: int | None = None) -> None:
        """ClearCache: the batch's step (None: every step) is never read."""
        if batch_id is None:
            self.steps.clear()
        else:
            self.steps.pop(batch_id, None)
