"""Which slot of the recurrent state pools each sequence of a linear-attention model holds
(shard/models/linear_attention.py). A slot is in use while a cached batch holds its request, so
the free ones are those no live batch names: nothing is released by hand, and a request the
router filters out or clears frees its slot with it (as LoRA slots are, shard/lora/manager.py).
A request that starts takes a slot whatever it held before: its first step starts the state
from zeros (AttentionMetadata.host_fresh)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

# Sequences a linear-attention model's shard holds states for when the router sets no
# --max-batch-size (vLLM's max_num_seqs is 256 on a GPU; a state costs megabytes).
DEFAULT_STATE_SLOTS = 128


class StateSlotsExhaustedError(ValueError):
    pass


def assign_state_slots(
    count: int, live: Iterable[torch.Tensor | None], capacity: int
) -> torch.Tensor:
    """[count] int64 slots no tensor of `live` holds, lowest first; an error naming the limit
    when fewer than `count` are free (the router keeps batches within it: WarmupResponse's
    max_batch_size)."""
    taken: set[int] = set()
    for slots in live:
        if slots is not None:
            taken.update(slots.tolist())
    free = [s for s in range(capacity) if s not in taken][:count]
    if len(free) < count:
        raise StateSlotsExhaustedError(
            f"{count} new sequences need recurrent state slots but {capacity - len(taken)} of "
            f"{capacity} are free: the router must keep batches within --max-batch-size "
            f"{capacity}"
        )
    return torch.tensor(free, dtype=torch.int64)
