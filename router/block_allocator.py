"""The KV block allocator: the router decides which cache blocks and slots each request owns.

A request reserves room for its whole life (prompt + max_new_tokens) when it is admitted, so a
running batch can never run out of cache mid-generation and no preemption is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Allocation:
    blocks: tuple[int, ...]
    # slots[p] is the cache slot of position p: blocks[p // block_size] * block_size + offset.
    slots: tuple[int, ...]


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int, reserved: int = 0) -> None:
        """Blocks [0, reserved) are never handed out (shards may use them as padding)."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if not 0 <= reserved <= num_blocks:
            raise ValueError(f"cannot reserve {reserved} of {num_blocks} blocks")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reserved = reserved
        # Popped from the end: low block ids go out first, which keeps traces readable.
        self._free: list[int] = list(range(num_blocks - 1, reserved - 1, -1))
        self._used: set[int] = set()

    @property
    def capacity_blocks(self) -> int:
        return self.num_blocks - self.reserved

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return len(self._used)

    def blocks_needed(self, n_tokens: int) -> int:
        return math.ceil(n_tokens / self.block_size)

    def allocate(self, n_tokens: int) -> Allocation | None:
        """Blocks and slots for n_tokens positions, or None when not enough blocks are free."""
        if n_tokens <= 0:
            raise ValueError(f"n_tokens must be positive, got {n_tokens}")
        needed = self.blocks_needed(n_tokens)
        if needed > len(self._free):
            return None
        blocks = tuple(self._free.pop() for _ in range(needed))
        self._used.update(blocks)
        bs = self.block_size
        slots = tuple(blocks[p // bs] * bs + p % bs for p in range(n_tokens))
        return Allocation(blocks=blocks, slots=slots)

    def free(self, blocks: tuple[int, ...] | list[int]) -> None:
        unknown = [b for b in blocks if b not in self._used]
        if unknown or len(set(blocks)) != len(blocks):
            # A double free would hand one block to two requests: fail loudly instead.
            raise ValueError(f"freeing blocks that are not allocated (or twice): {list(blocks)}")
        self._used.difference_update(blocks)
        self._free.extend(reversed(blocks))
