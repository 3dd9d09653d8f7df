"""The KV block allocator: the router decides which cache blocks and slots each request owns.

A request reserves room for its whole life (prompt + max_new_tokens) when it is admitted, so a
running batch can never run out of cache mid-generation and no preemption is needed.

With a prefix cache (router/prefix_cache.py) a block may be referenced by several requests: the
cached prefix blocks they share read-only. Life of a block: free -> referenced by the request
that writes it -> named by the cache once full and computed -> referenced by more requests that
start with that prefix -> parked (named, unreferenced, evictable) when the last one leaves ->
referenced again by a request that matches it, or evicted (unnamed, least recently used first)
when a request needs a block and no unnamed one is free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.prefix_cache import PrefixCache, PrefixMatch, PrefixRun


def slots_of(blocks: Sequence[int], n_tokens: int, block_size: int) -> tuple[int, ...]:
    """The cache slot of each of the first n_tokens positions through a block table:
    slot = blocks[p // block_size] * block_size + p % block_size (the shards' row index)."""
    return tuple(blocks[p // block_size] * block_size + p % block_size for p in range(n_tokens))


@dataclass(frozen=True)
class Allocation:
    blocks: tuple[int, ...]
    # slots[p] is the cache slot of position p: blocks[p // block_size] * block_size + offset.
    slots: tuple[int, ...]
    # Leading positions whose K/V the cache already holds (the shards start after them).
    cached_tokens: int = 0
    # Where the request's chain of block hashes stands (None without a prefix cache).
    run: PrefixRun | None = None


class BlockAllocator:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        reserved: int = 0,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        """Blocks [0, reserved) are never handed out (shards may use them as padding)."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if not 0 <= reserved <= num_blocks:
            raise ValueError(f"cannot reserve {reserved} of {num_blocks} blocks")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reserved = reserved
        self.cache = prefix_cache
        # Unnamed free blocks. Popped from the end: low block ids go out first, which keeps
        # traces readable.
        self._free: list[int] = list(range(num_blocks - 1, reserved - 1, -1))
        self._refs: dict[int, int] = {}  # referenced block -> requests holding it
        self._extra_refs = 0  # sum of (refs - 1): how many holds are shared ones

    @property
    def capacity_blocks(self) -> int:
        return self.num_blocks - self.reserved

    @property
    def free_blocks(self) -> int:
        """Blocks a request may take: unnamed ones and evictable cached ones."""
        return len(self._free) + (self.cache.evictable_blocks if self.cache else 0)

    @property
    def used_blocks(self) -> int:
        return len(self._refs)

    @property
    def shared_tokens(self) -> int:
        """Tokens the requests' reservations count more than once (shared blocks): the token
        budgets subtract them so that a shared block counts once."""
        return self._extra_refs * self.block_size

    def blocks_needed(self, n_tokens: int) -> int:
        return math.ceil(n_tokens / self.block_size)

    def match(
        self,
        prompt: Sequence[int],
        adapter_id: str = "",
        prompt_len: int | None = None,
        total_len: int | None = None,
    ) -> PrefixMatch:
        """Cached blocks the prompt may start with (nothing is taken yet). prompt_len: the
        request's whole prompt length where `prompt` is less of it (reusable_prompt): it picks
        the chain the request's own blocks are named in (PrefixCache.new_run). total_len: the
        positions it may reach; a longrope request that may grow past the boundary neither
        reads nor names cached blocks (PrefixCache.may_cross)."""
        if self.cache is None:
            return PrefixMatch(PrefixRun(adapter_id))
        return self.cache.match(prompt, adapter_id, prompt_len, total_len)

    def shared_by(self, match: PrefixMatch) -> int:
        """Tokens of the match that running requests already hold: admitting it adds a
        reference to those blocks, no memory."""
        return sum(1 for b in match.blocks if b in self._refs) * self.block_size

    def allocate(self, n_tokens: int, match: PrefixMatch | None = None) -> Allocation | None:
        """Blocks and slots for n_tokens positions, starting with the match's cached blocks;
        None when not enough blocks are free (then nothing is taken)."""
        if n_tokens <= 0:
            raise ValueError(f"n_tokens must be positive, got {n_tokens}")
        shared = match.blocks if match is not None else ()
        fresh = self.blocks_needed(n_tokens) - len(shared)
        parked = [b for b in shared if b not in self._refs]
        if fresh > self.free_blocks - len(parked):
            return None
        for block in parked:
            assert self.cache is not None
            self.cache.unpark(block)
        for block in shared:
            self._hold(block)
        new = []
        for _ in range(fresh):
            # Evicting destroys a cached prefix: only when no unnamed block is left.
            block = self._free.pop() if self._free else self.cache.evict()  # type: ignore[union-attr]
            self._hold(block)
            new.append(block)
        blocks = (*shared, *new)
        slots = slots_of(blocks, n_tokens, self.block_size)
        run = match.run if match is not None and self.cache is not None else None
        return Allocation(blocks, slots, cached_tokens=len(shared) * self.block_size, run=run)

    def commit(
        self, allocation: Allocation, computed: int, tokens: Callable[[], Sequence[int]]
    ) -> None:
        """Tells the cache that the request's first `computed` positions hold `tokens()`'s K/V
        (read only when a block got full: this runs for every request at every step)."""
        run = allocation.run
        if self.cache is not None and run is not None:
            if computed // self.block_size > len(run.hashes):
                self.cache.commit(run, allocation.blocks, tokens()[:computed])

    def free(self, blocks: tuple[int, ...] | list[int]) -> None:
        """Drops one request's hold on its blocks."""
        unknown = [b for b in blocks if b not in self._refs]
        if unknown or len(set(blocks)) != len(blocks):
            # A double free would hand one block to two requests: fail loudly instead.
            raise ValueError(f"freeing blocks that are not allocated (or twice): {list(blocks)}")
        released = []
        for block in blocks:
            if self._refs[block] > 1:
                self._refs[block] -= 1
                self._extra_refs -= 1
            else:
                del self._refs[block]
                released.append(block)
        # The tail first: its blocks are evicted before the prefix they continue, which more
        # requests are likely to share.
        released.reverse()
        if self.cache is None:
            self._free.extend(released)
            return
        self.cache.park(b for b in released if self.cache.is_named(b))
        self._free.extend(b for b in released if not self.cache.is_named(b))

    def forget_adapter(self, adapter_id: str) -> None:
        """An unloaded adapter's cached blocks are wrong for a new adapter of the same name."""
        if self.cache is not None:
            self._free.extend(self.cache.forget_adapter(adapter_id))

    def _hold(self, block: int) -> None:
        if block in self._refs:
            self._refs[block] += 1
            self._extra_refs += 1
        else:
            self._refs[block] = 1
