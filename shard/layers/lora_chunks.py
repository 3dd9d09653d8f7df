"""B of a LoRA term's slots in column chunks, the layout the native CPU kernel's expand reads
(shard/platforms/cpu/native/lora.cpp, `kExpandCols`).

The torch path keeps B as rows of B^T ([S * n_sub * r, N], `_Packed` in lora.py): one GEMM
expands every sub-module. The native kernel's expand works on 64-column tiles, and on those
rows a tile is 128 bytes of each of r rows a whole output width apart; read that way, a step's
adapters came from memory at half the rate the shrink reads A (docs/benchmarks.md, twenty-third
session). In chunks, each tile's r rows of 64 values are contiguous, and a slot's tiles follow
one another: [S, C, r, 64] for C = sum_j ceil(n_j / 64), zero past each sub-module's columns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

EXPAND_COLUMNS = 64  # lora.cpp's kExpandCols


def chunk_rows(b_rows: torch.Tensor, out_slices: tuple[int, ...], rank: int) -> torch.Tensor:
    """`_Packed` rows of B^T [S * n_sub * rank, N] (sub-module j's in its own columns) ->
    [S * C * rank, EXPAND_COLUMNS]."""
    n_sub = len(out_slices)
    slots = b_rows.shape[0] // (n_sub * rank)
    by_sub = b_rows.view(slots, n_sub, rank, b_rows.shape[1])
    parts, offset = [], 0
    for j, width in enumerate(out_slices):
        part = F.pad(by_sub[:, j, :, offset : offset + width], (0, -width % EXPAND_COLUMNS))
        # [S, r, C_j * 64] -> [S, C_j, r, 64]
        parts.append(part.view(slots, rank, -1, EXPAND_COLUMNS).transpose(1, 2))
        offset += width
    return torch.cat(parts, dim=1).reshape(-1, EXPAND_COLUMNS).contiguous()


class ChunkedB:
    """The chunked copy of a `_Packed` B, kept in step with it one slot at a time."""

    def __init__(self, b_rows: torch.Tensor, out_slices: tuple[int, ...], rank: int) -> None:
        self.out_slices = out_slices
        self.rank = rank
        self.values = chunk_rows(b_rows, out_slices, rank)
        self.rows_per_slot = rank * sum(-(-width // EXPAND_COLUMNS) for width in out_slices)

    def refill(self, slot: int, slot_b_rows: torch.Tensor) -> None:
        """Slot `slot` again from its `_Packed` rows [n_sub * rank, N]."""
        rows = slice(slot * self.rows_per_slot, (slot + 1) * self.rows_per_slot)
        self.values[rows] = chunk_rows(slot_b_rows, self.out_slices, self.rank)
