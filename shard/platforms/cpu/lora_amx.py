"""A LoRA term's slots in the AMX tile kernel's layout (shard/platforms/cpu/native/amx_lora.cpp), so
that a bf16 linear whose weight the tile kernel multiplies adds its step's LoRA terms in the same
call.

Why: at a decode step's size a term on AVX-512 (lora.cpp) costs ~20 us a linear for 16 tokens
at rank 16, mostly arithmetic and its own pass over the output, against ~3 us to read a slot's
weights; the tile unit does the shrink as one more small tile product and the expand as more of
the base product's K, rounded once with it. See amx_lora.cpp for the layouts:
    a  [n_sub * C / 16, K / 32, 16, 16, 2]   A_j of slot s at rows j * C + s * rank ..
    b  [C / 32, N / 16, 16, 16, 2]           output n's B row of slot s at columns s * rank ..
                                             (column blocks outermost)
where rank is the term's largest rank in use rounded up to 16 and C = slots * rank rounded up
to 32. A slot's rows of `a` are whole tile blocks, so a fill rewrites only its own blocks; its
columns of `b` share 32-column blocks with a neighbour's, which are rebuilt whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shard.platforms.cpu import matmul_amx
from shard.platforms.cpu.native.build import amx_lora_linear_kernel

BLOCK = 16  # a slot's rank, rounded up to this: its rows of `a` are whole tile blocks
COLUMNS = 32  # `b`'s columns per tile block


def kernel_for(
    weight: torch.Tensor, out_slices: tuple[int, ...]
) -> Callable[..., torch.Tensor] | None:
    """The kernel's call for a term over the linear weight `weight`, or None where it cannot
    take it: the weight is not in the tile layout, a sub-module's outputs are not whole blocks
    of 16, or the kernel is not built."""
    if not matmul_amx.is_packed(weight) or any(n % matmul_amx.BLOCK_OUT for n in out_slices):
        return None
    return amx_lora_linear_kernel()


@dataclass
class LoraTiles:
    a: torch.Tensor
    b: torch.Tensor
    rank: int  # per slot, a multiple of BLOCK

    @staticmethod
    def build(lora_a: torch.Tensor, lora_b: torch.Tensor, rank: int) -> LoraTiles:
        """The tiles of every slot of lora_a [S, n_sub, R, K] / lora_b [S, N, R], `rank` being
        the largest rank in use (> 0)."""
        slots, n_sub, _, k = lora_a.shape
        rank = -(-rank // BLOCK) * BLOCK
        columns = -(-(slots * rank) // COLUMNS) * COLUMNS
        n = lora_b.shape[1]
        tiles = LoraTiles(
            lora_a.new_zeros(n_sub * columns // 16, k // 32, 16, 16, 2),
            lora_b.new_zeros(columns // COLUMNS, n // 16, 16, 16, 2),
            rank,
        )
        for slot in range(slots):
            tiles.refill(slot, lora_a, lora_b)
        return tiles

    def refill(self, slot: int, lora_a: torch.Tensor, lora_b: torch.Tensor) -> None:
        """Slot `slot` again from the term's buffers (its rank fits `rank`)."""
        _, n_sub, max_rank, k = lora_a.shape
        used = min(self.rank, max_rank)
        columns = self.b.shape[0] * COLUMNS
        rows = lora_a.new_zeros(n_sub, self.rank, k)
        rows[:, :used] = lora_a[slot, :, :used]
        for j in range(n_sub):  # the slot's rank rows of A_j, whole blocks
            first = (j * columns + slot * self.rank) // 16
            self.a[first : first + self.rank // 16] = matmul_amx.pack(rows[j])
        lo, hi = slot * self.rank // COLUMNS, (slot * self.rank + self.rank - 1) // COLUMNS
        columns_b = matmul_amx.pack(_b_columns(lora_b, self.rank, lo, hi + 1))
        self.b[lo : hi + 1] = columns_b.transpose(0, 1)


def _b_columns(lora_b: torch.Tensor, rank: int, lo: int, hi: int) -> torch.Tensor:
    """Columns [lo * 32, hi * 32) of the expand's matrix [N, C]: column s * rank + i holds
    lora_b[s, :, i] (zeros past a slot's R or past the last slot)."""
    slots, n, max_rank = lora_b.shape
    out = lora_b.new_zeros(n, (hi - lo) * COLUMNS)
    first, last = lo * COLUMNS, hi * COLUMNS
    for slot in range(first // rank, min(slots, -(-last // rank))):
        start, stop = max(first, slot * rank), min(last, slot * rank + min(rank, max_rank))
        if start < stop:
            i = start - slot * rank
            out[:, start - first : stop - first] = lora_b[slot, :, i : i + stop - start]
    return out
