"""Automatic prefix caching: which KV blocks hold which token prefixes (vLLM's scheme).

A full block is named by a chained hash of (the previous block's hash, the block's token ids,
the LoRA adapter id): equal hashes mean equal tokens at equal positions under the same weights,
hence equal K/V, so a new request may read such a block instead of computing it. For a longrope
model the chain starts from another root when the request's prompt is longer than the shards'
rope regime boundary: the shards rotate all of such a prompt's K with the long tables, and a
shorter prompt's with the short ones, so the two never share a block. A request whose prompt is
at most the boundary long but may generate past it is left out altogether (`may_cross`): the
shards recompute its whole sequence with the long tables at the crossing, rewriting its blocks
in place, so it may neither read nor name any. Only blocks that are full and whose every
position the shards have computed are named (`insert`): a block still being written is never
found, so never shared. Shared blocks are read-only: a request computes from its first unshared
position on, and the last prompt token is always computed (its logits give the first generated
token).

The cache names blocks; the allocator (router/block_allocator.py) owns them and counts their
references. A block whose last reference goes stays named and joins the evictable set, least
recently used first; the allocator takes those only when no unnamed block is free.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from router.request import ValidRequest

BlockHash = bytes

# Where the chain of a prompt longer than a longrope model's original_max_position_embeddings
# starts: its K/V differ from a shorter prompt's at every position (the shards rotate all its
# tokens with the long tables), so equal tokens must not give equal names. A digest, as every
# other block's `previous` is, so no adapter id or token run can spell it.
LONG_ROPE_ROOT: BlockHash = hashlib.sha256(b"switchyard: longrope long-table prompts").digest()


def reusable_prompt(request: ValidRequest) -> Sequence[int]:
    """The prompt tokens the cache may serve: none when the request wants prompt logprobs
    (decoder_input_details), which need every prompt position computed. Its blocks are still
    named once computed, for later requests."""
    return () if request.decoder_input_details else request.input_ids


def block_hash(previous: BlockHash, tokens: Sequence[int], adapter_id: str) -> BlockHash:
    """sha256, not Python's hash(): a collision would hand one prompt another's K/V, and
    Python's int hashing is predictable enough for a client to craft one."""
    h = hashlib.sha256(previous)
    h.update(adapter_id.encode())
    h.update(b"\0")
    h.update(array("I", tokens).tobytes())
    return h.digest()


@dataclass
class PrefixRun:
    """The chained hashes of one request's leading full, computed blocks: how far the cache has
    been told about its blocks (`commit` continues the chain from here)."""

    adapter_id: str
    hashes: list[BlockHash] = field(default_factory=list)
    # What the first block's hash chains from: b"", or LONG_ROPE_ROOT for a long-table prompt.
    root: BlockHash = b""

    @property
    def last(self) -> BlockHash:
        return self.hashes[-1] if self.hashes else self.root


@dataclass(frozen=True)
class PrefixMatch:
    """Cached blocks a prompt may start with, found before any block is taken."""

    # None: the request's blocks stay private, never named (PrefixCache.may_cross).
    run: PrefixRun | None
    blocks: tuple[int, ...] = ()


class PrefixCache:
    def __init__(self, block_size: int, rope_regime_boundary: int = 0) -> None:
        """rope_regime_boundary: the shards' InfoResponse.rope_regime_boundary (0: a token's
        K/V never depend on its sequence's length)."""
        self.block_size = block_size
        self.rope_regime_boundary = rope_regime_boundary
        self._block_of: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}
        self._adapter_of: dict[int, str] = {}
        # Named blocks nobody references, least recently used first.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    @property
    def cached_blocks(self) -> int:
        """Blocks holding a named prefix, referenced or not."""
        return len(self._hash_of)

    @property
    def evictable_blocks(self) -> int:
        return len(self._evictable)

    def is_named(self, block: int) -> bool:
        return block in self._hash_of

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def new_run(self, adapter_id: str, prompt_len: int) -> PrefixRun:
        """The empty chain of a request whose whole prompt is prompt_len tokens long.

        Longrope shards rotate every token of a prompt longer than the boundary with the long
        tables, and a shorter prompt's tokens (and the generated ones below the boundary) with
        the short ones: such requests get separate chains. A short prompt only ever reads
        blocks below the boundary, which short prompts computed with the short tables too."""
        long = 0 < self.rope_regime_boundary < prompt_len
        return PrefixRun(adapter_id, root=LONG_ROPE_ROOT if long else b"")

    def may_cross(self, prompt_len: int, total_len: int) -> bool:
        """Whether a request of prompt_len tokens that may reach total_len positions (prompt +
        max_new_tokens) may grow past the longrope boundary. At the step whose token sits at
        the boundary the shards recompute its whole sequence with the long tables, as
        transformers does (shard/step_inputs.py: step_starts), rewriting every block it holds:
        a block it shared would change under its other readers, and its own hold long-table
        K/V at names that promise the short tables. It runs the token at the boundary only if
        it generates past it: total_len >= boundary + 2."""
        boundary = self.rope_regime_boundary
        return 0 < boundary and prompt_len <= boundary and boundary + 1 < total_len

    def match(
        self,
        prompt: Sequence[int],
        adapter_id: str,
        prompt_len: int | None = None,
        total_len: int | None = None,
    ) -> PrefixMatch:
        """The longest run of named blocks the prompt starts with, leaving at least its last
        token to compute. Hashes block by block and stops at the first miss, so a prompt that
        shares nothing costs one hash. prompt_len: the request's whole prompt length, when
        `prompt` is less of it (reusable_prompt), for its chain's root; default len(prompt).
        total_len: the positions it may reach (prompt + max_new_tokens); one that may cross the
        longrope boundary gets no blocks and no chain (`may_cross`)."""
        bs = self.block_size
        prompt_len = len(prompt) if prompt_len is None else prompt_len
        if total_len is not None and self.may_cross(prompt_len, total_len):
            return PrefixMatch(None)
        run = self.new_run(adapter_id, prompt_len)
        blocks: list[int] = []
        for i in range((len(prompt) - 1) // bs):
            h = block_hash(run.last, prompt[i * bs : (i + 1) * bs], adapter_id)
            block = self._block_of.get(h)
            if block is None:
                break
            run.hashes.append(h)
            blocks.append(block)
        return PrefixMatch(run, tuple(blocks))

    def commit(self, run: PrefixRun, blocks: Sequence[int], tokens: Sequence[int]) -> None:
        """Names the request's blocks that `tokens` (its computed positions) fill, past those
        already in `run`. A block whose prefix another block already holds stays unnamed (two
        requests computed it at once): one name, one block."""
        bs = self.block_size
        for i in range(len(run.hashes), len(tokens) // bs):
            h = block_hash(run.last, tokens[i * bs : (i + 1) * bs], run.adapter_id)
            run.hashes.append(h)  # the chain goes on through the other block's name
            if h not in self._block_of and blocks[i] not in self._hash_of:
                self._block_of[h] = blocks[i]
                self._hash_of[blocks[i]] = h
                self._adapter_of[blocks[i]] = run.adapter_id

    def park(self, blocks: Iterable[int]) -> None:
        """Named blocks whose last reference went, in the order they should be evicted."""
        for block in blocks:
            self._evictable[block] = None

    def unpark(self, block: int) -> None:
        """A parked block is referenced again: it can no longer be evicted."""
        del self._evictable[block]

    def evict(self) -> int:
        """Forgets the least recently used evictable block and returns it for reuse."""
        block, _ = self._evictable.popitem(last=False)
        self._forget(block)
        self.evictions += 1
        return block

    def forget_adapter(self, adapter_id: str) -> list[int]:
        """Unnames every block of an adapter (it was unloaded: a later adapter of the same name
        has other weights) and returns the evictable ones, now plain free blocks."""
        blocks = [b for b, a in self._adapter_of.items() if a == adapter_id]
        freed = [b for b in blocks if b in self._evictable]
        for block in freed:
            del self._evictable[block]
        for block in blocks:
            self._forget(block)
        return freed

    def _forget(self, block: int) -> None:
        del self._block_of[self._hash_of.pop(block)]
        del self._adapter_of[block]
