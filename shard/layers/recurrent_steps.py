"""What the recurrent mixers' math shares (Gated DeltaNet's shard/layers/gated_delta.py, Mamba 2's
shard/layers/ssd.py): a sequence's starting state from its slot in a per-layer pool, and where a
step's ragged prompt chunks go when they are scanned in blocks of a fixed number of tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def starting_states(pool: torch.Tensor, slots: torch.Tensor, fresh: list[bool]) -> torch.Tensor:
    """Each sequence's state from its slot, zeros for fresh ones: a fresh slot's content is
    whatever its previous owner left (NaN included), so it is overwritten, not multiplied away."""
    rows = pool.index_select(0, slots)
    if any(fresh):
        mask = torch.tensor(fresh, dtype=torch.bool, device=pool.device)
        rows = rows.masked_fill(mask.view(-1, *([1] * (rows.dim() - 1))), 0)
    return rows


@dataclass(frozen=True)
class BlockLayout:
    """Where a step's tokens go in blocks of `block` tokens, on the host.

    Sequences are taken longest first (`order`), and blocks step by step: all sequences' first
    blocks, then the second blocks of those that have one, and so on. The sequences with a j-th
    block are then the first `active[j]` in `order`, and their j-th blocks lie side by side, so
    the scan over blocks works on slices of the state and of the blocks."""

    order: list[int]  # sequence indices, most blocks first
    active: list[int]  # per scan step: how many sequences (a prefix of `order`) have a block
    gather: list[int]  # per block position: the token there, or T (a zero row) past the end
    token_pos: list[int]  # per token: its position in the blocks, flattened

    @classmethod
    def build(cls, lengths: list[int], block: int) -> BlockLayout:
        blocks = [-(-length // block) for length in lengths]
        starts = [0]
        for length in lengths[:-1]:
            starts.append(starts[-1] + length)
        order = sorted(range(len(lengths)), key=lambda b: -blocks[b])
        total = sum(lengths)
        steps = max(blocks, default=0)
        active = [sum(1 for n in blocks if n > j) for j in range(steps)]
        gather: list[int] = []
        token_pos = [0] * total
        for j, count in enumerate(active):
            for b in order[:count]:
                first = starts[b] + j * block
                size = min(block, lengths[b] - j * block)
                token_pos[first : first + size] = range(len(gather), len(gather) + size)
                gather.extend(range(first, first + size))
                gather.extend([total] * (block - size))
        return cls(order, active, gather, token_pos)


def to_blocks(x: torch.Tensor, gather: torch.Tensor, block: int) -> torch.Tensor:
    """Packed tokens [T, H, ...] -> float32 blocks [N, H, C, ...] of `block` tokens, laid out
    as a BlockLayout's `gather` says (index T: a zero row past a sequence's end)."""
    x = torch.cat([x.float(), x.new_zeros(1, *x.shape[1:], dtype=torch.float32)])
    x = x.index_select(0, gather).unflatten(0, (-1, block))
    return x.transpose(1, 2)
