"""Speculative decoding on the shard: verifying the tokens the router proposes for decoding rows.

The router proposes (router/speculation/); the shard verifies. A decoding row at history length
h (its last known token at position h - 1 has no K/V yet) with proposals d1..dk runs positions
h - 1 .. h + k - 1 in one forward pass, as a prompt chunk does (the prefill part of the step),
and samples at every one of them as if they were k + 1 separate steps: the sample at position
h - 1 + j sees the history with d1..dj in it (penalties), draws the random number of history
length h + j (seeded rows) and, for a constrained row, the grammar's mask after d1..dj. Its
answer is t0..tn, where n is the number of leading j with t_j == d_{j+1}: every token the
non-speculative server would have produced one step at a time, then the first that differs
from the proposal (or the one after the last proposal).

For greedy rows that is exact by construction. For sampled rows it is rejection sampling with a
deterministic proposal (q is one-hot at d): the proposal is accepted with probability p(d), and
on rejection the token drawn is distributed as p without d, renormalised, which is the residual
max(0, p - q) / (1 - p(d)); so the output distribution is the target's, and with a seed it is
the same tokens as without speculation.

K/V written for rejected positions stays past the row's cache length and is overwritten by the
next step; tokens written into the history past its length are never read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from shard.batch import Batch
from shard.step_inputs import upload


@dataclass(frozen=True)
class Drafts:
    """The proposals a step verifies, planned on the host."""

    counts: torch.Tensor  # [B] int64 proposed tokens per row (0: none)
    lens: torch.Tensor  # [B] int64 each row's history length before the step
    ids: dict[int, list[int]]  # by row: the proposed ids
    # By row: the grammar's mask after each proposed token (constrained rows only).
    masks: dict[int, Sequence[bytes]]


def plan(
    batch: Batch,
    proposals: Mapping[int, Sequence[int]],
    proposal_masks: Mapping[int, Sequence[bytes]],
    starts: torch.Tensor,
    vocab_size: int,
    rope_regime_boundary: int = 0,
) -> Drafts | None:
    """The step's proposals by row (`proposals`: ids by request id), checked: only decoding
    rows, within the row's reserved slots and the vocabulary. None when there are none."""
    proposals = {rid: ids for rid, ids in proposals.items() if len(ids)}
    if not proposals:
        return None
    rows = batch.rows(list(proposals))
    counts = torch.zeros(len(batch), dtype=torch.int64)
    ids_by_row: dict[int, list[int]] = {}
    masks_by_row: dict[int, Sequence[bytes]] = {}
    for rid, row in zip(proposals, rows, strict=True):
        ids = [int(i) for i in proposals[rid]]
        request = batch.requests[row]
        h = int(batch.history_lens[row])
        if h - int(batch.cache_lens[row]) != 1 or int(starts[row]) != h - 1:
            raise ValueError(f"request {rid}: proposals are only verified for a decoding request")
        room = request.capacity - h
        if len(ids) > room:
            raise ValueError(
                f"request {rid}: {len(ids)} proposed tokens, but its KV slots hold {room} more"
            )
        if any(not 0 <= i < vocab_size for i in ids):
            raise ValueError(f"request {rid}: proposed token ids must be below {vocab_size}")
        ids = ids[: _before_rope_boundary(request.input_len, h, rope_regime_boundary, len(ids))]
        if request.constrained:
            masks = proposal_masks.get(rid, ())
            if len(masks) < len(ids):
                raise ValueError(
                    f"request {rid} is constrained: each proposed token needs the mask after it "
                    f"({len(ids)} proposed, {len(masks)} masks)"
                )
            masks_by_row[row] = masks
        if ids:
            counts[row] = len(ids)
            ids_by_row[row] = ids
    if not ids_by_row:
        return None
    return Drafts(counts, batch.history_lens.clone(), ids_by_row, masks_by_row)


def _before_rope_boundary(input_len: int, h: int, boundary: int, k: int) -> int:
    """How many of k proposals a row may verify before its sequence crosses longrope's boundary
    (shard/step_inputs.py): a row that crosses it is recomputed whole with the long tables, one
    token at a time, so proposals stop short of position `boundary`."""
    if boundary <= 0 or input_len > boundary or h > boundary:
        return k
    return max(0, min(k, boundary - h))


def write(batch: Batch, drafts: Drafts, device: torch.device) -> None:
    """Puts the proposed tokens into the device history after each row's known ones, where the
    step's inputs and the sampler's penalties read them."""
    rows = [row for row, ids in drafts.ids.items() for _ in ids]
    positions = [
        int(drafts.lens[row]) + j for row, ids in drafts.ids.items() for j in range(len(ids))
    ]
    ids = [i for row_ids in drafts.ids.values() for i in row_ids]
    on_device = upload(
        {
            "rows": torch.tensor(rows, dtype=torch.int64),
            "positions": torch.tensor(positions, dtype=torch.int64),
            "ids": torch.tensor(ids, dtype=torch.int64),
        },
        device,
    )
    batch.history[on_device["rows"], on_device["positions"]] = on_device["ids"]


def accepted(drafts: Drafts, row: int, sampled: Sequence[int]) -> int:
    """How many of the row's proposals the step's samples (t0..tk) confirm: the leading
    t_j == d_{j+1}."""
    n = 0
    for proposed, got in zip(drafts.ids[row], sampled, strict=False):
        if proposed != got:
            break
        n += 1
    return n


def settle(batch: Batch, drafts: Drafts, row: int, n: int) -> None:
    """The row's host lengths once the step's answer is known: n proposals and the token after
    them are known, and every position before that token now has its K/V."""
    h = int(drafts.lens[row])
    batch.history_lens[row] = h + n + 1
    batch.cache_lens[row] = h + n
