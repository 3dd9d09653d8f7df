"""The prefix cache and the allocator's shared blocks: what is matched, counted, kept, evicted."""

import pytest

from router.block_allocator import BlockAllocator
from router.prefix_cache import PrefixCache, reusable_prompt
from router.request import SamplingParams, ValidRequest

BS = 4


def allocator(blocks: int = 16, rope_regime_boundary: int = 0) -> BlockAllocator:
    cache = PrefixCache(BS, rope_regime_boundary)
    return BlockAllocator(blocks, BS, reserved=1, prefix_cache=cache)


def admit(a: BlockAllocator, prompt: list[int], max_new: int = 2, adapter: str = ""):
    return a.allocate(len(prompt) + max_new, a.match(prompt, adapter))


def computed(a: BlockAllocator, alloc, tokens: list[int]) -> None:
    a.commit(alloc, len(tokens), lambda: tokens)


def test_full_computed_blocks_are_shared_and_the_rest_is_fresh():
    a = allocator()
    prompt = list(range(10, 20))  # 2 full blocks and 2 tokens
    first = admit(a, prompt)
    assert first.cached_tokens == 0
    computed(a, first, prompt[:7])  # one block full so far
    assert admit(a, prompt[:9], 1).cached_tokens == 4  # only what was computed is named
    computed(a, first, prompt)
    second = admit(a, prompt[:8] + [99, 98, 97])
    assert second.cached_tokens == 8 and second.blocks[:2] == first.blocks[:2]
    assert not set(second.blocks[2:]) & set(first.blocks)
    assert second.slots[:8] == first.slots[:8]


def test_the_last_prompt_token_is_always_computed():
    a = allocator()
    prompt = list(range(8))
    first = admit(a, prompt)
    computed(a, first, prompt + [50])
    assert admit(a, prompt).cached_tokens == 4  # 8 cached would leave nothing to compute
    assert admit(a, prompt + [50]).cached_tokens == 8


def test_different_adapters_never_share():
    a = allocator()
    prompt = list(range(9))
    computed(a, admit(a, prompt, adapter="a"), prompt)
    assert admit(a, prompt, adapter="b").cached_tokens == 0
    assert admit(a, prompt).cached_tokens == 0
    assert admit(a, prompt, adapter="a").cached_tokens == 8


def test_freed_blocks_stay_cached_and_shared_blocks_count_once():
    a = allocator()
    prompt = list(range(13))
    first = admit(a, prompt, 3)  # 16 tokens, 4 blocks
    computed(a, first, prompt)
    second = admit(a, prompt, 3)
    assert a.shared_tokens == 12 and a.used_blocks == 5
    a.free(first.blocks)
    assert a.shared_tokens == 0 and a.used_blocks == 4
    a.free(second.blocks)
    assert a.used_blocks == 0 and a.free_blocks == a.capacity_blocks
    assert a.cache.cached_blocks == 3  # the prompt's full blocks, now evictable
    assert admit(a, prompt).cached_tokens == 12


def test_eviction_takes_least_recently_used_and_tails_first():
    a = allocator(blocks=9)  # 8 usable
    old, new = list(range(100, 109)), list(range(200, 209))
    for prompt in (old, new):
        alloc = admit(a, prompt, 3)  # 3 blocks each
        computed(a, alloc, prompt)
        a.free(alloc.blocks)
    assert a.cache.cached_blocks == 4 and a.free_blocks == 8
    taker = a.allocate(5 * BS)  # 4 unnamed blocks free: one cached block must go
    assert taker is not None and a.cache.evictions == 1
    a.free(taker.blocks)
    # The old prompt's tail went first: its head is still there, the newer prompt whole.
    assert [len(a.match(p).blocks) for p in (old, new)] == [1, 2]


def test_a_block_computed_twice_keeps_one_name():
    a = allocator()
    prompt = list(range(9))
    x, y = admit(a, prompt), admit(a, prompt)  # both admitted before either computed
    computed(a, x, prompt)
    computed(a, y, prompt)
    assert a.cache.cached_blocks == 2
    z = admit(a, prompt)
    assert z.blocks[:2] == x.blocks[:2]
    a.free(z.blocks)
    a.free(x.blocks)
    a.free(y.blocks)  # y's duplicates were never named: plain free blocks again
    assert a.cache.evictable_blocks == 2


def test_an_unloaded_adapters_blocks_are_forgotten():
    a = allocator()
    prompt = list(range(9))
    alloc = admit(a, prompt, adapter="ad")
    computed(a, alloc, prompt)
    a.free(alloc.blocks)
    a.forget_adapter("ad")
    assert a.cache.cached_blocks == 0 and a.free_blocks == a.capacity_blocks
    assert admit(a, prompt, adapter="ad").cached_tokens == 0


@pytest.mark.parametrize("details", [False, True])
def test_requests_for_prompt_logprobs_skip_the_cache(details):
    request = ValidRequest(
        "abc", (1, 2, 3), SamplingParams(), max_new_tokens=1, decoder_input_details=details
    )
    assert tuple(reusable_prompt(request)) == (() if details else (1, 2, 3))


def test_without_a_cache_nothing_is_matched():
    a = BlockAllocator(8, BS)
    prompt = list(range(9))
    alloc = a.allocate(11, a.match(prompt))
    a.commit(alloc, 9, lambda: prompt)
    assert a.allocate(11, a.match(prompt)).cached_tokens == 0


# A longrope model's original_max_position_embeddings: prompts longer than it are computed with
# the long rope tables at every position, shorter ones with the short tables below it.
BOUNDARY = 8


def test_longrope_prompts_share_blocks_only_with_prompts_on_their_side_of_the_boundary():
    a = allocator(64, rope_regime_boundary=BOUNDARY)
    short = list(range(10, 17))  # 7 tokens: short tables
    computed(a, admit(a, short), short)
    assert admit(a, short[:4] + [90, 91]).cached_tokens == 4  # short with short
    assert admit(a, short[: BOUNDARY - 1] + [90]).cached_tokens == 4  # exactly B: still short
    long = short[:4] + list(range(50, 56))  # 10 tokens: long tables, same first block
    first_long = admit(a, long)
    assert first_long.cached_tokens == 0  # the short request's block holds short-table K
    computed(a, first_long, long)
    assert admit(a, long[:8] + [99]).cached_tokens == 8  # long with long
    # A short prompt starting with the long request's blocks finds none of them.
    assert admit(a, long[:7]).cached_tokens == 4  # only the short request's block
    other = list(range(60, 70))  # long, 10 tokens
    computed(a, admit(a, other), other)
    assert admit(a, other[:6]).cached_tokens == 0
    assert admit(a, other[:8] + [1]).cached_tokens == 8


def test_a_short_requests_generated_blocks_past_the_boundary_serve_no_long_prompt():
    """Generated tokens past the boundary are rotated with the long tables, but the short
    request's earlier blocks hold short-table K: none of its chain may serve a long prompt."""
    a = allocator(64, rope_regime_boundary=BOUNDARY)
    prompt = list(range(20, 26))  # 6 tokens, then 6 generated: 3 full blocks
    alloc = admit(a, prompt, max_new=6)
    tokens = prompt + list(range(80, 86))
    computed(a, alloc, tokens)
    assert a.cache.cached_blocks == 3
    assert admit(a, tokens + [1]).cached_tokens == 0  # 13 tokens: long
    assert admit(a, tokens[:7]).cached_tokens == 4  # short again: its first block only


def test_prompt_logprob_requests_name_their_blocks_on_their_side_of_the_boundary():
    """Such a request matches nothing (reusable_prompt is empty), but its blocks are named in
    the chain its whole prompt's length picks."""
    a = allocator(64, rope_regime_boundary=BOUNDARY)
    long = list(range(30, 40))  # 10 tokens
    alloc = a.allocate(len(long) + 1, a.match((), "", len(long)))
    computed(a, alloc, long)
    assert admit(a, long[:8] + [1]).cached_tokens == 8
    assert admit(a, long[:6]).cached_tokens == 0


def test_without_a_boundary_long_and_short_prompts_share():
    a = allocator()
    prompt = list(range(10, 20))
    computed(a, admit(a, prompt[:7]), prompt[:7])
    assert admit(a, prompt).cached_tokens == 4


def test_may_cross_is_a_short_prompt_whose_sequence_may_grow_past_the_boundary():
    cache = PrefixCache(BS, BOUNDARY)
    # The token at position B runs (and is recomputed with the long tables) only when another
    # follows it: B + 2 positions at least.
    assert cache.may_cross(BOUNDARY, BOUNDARY + 2)  # exactly B, two tokens more
    assert not cache.may_cross(BOUNDARY, BOUNDARY + 1)  # its last token sits at B, never runs
    assert cache.may_cross(1, 30)
    assert not cache.may_cross(3, BOUNDARY)  # stays within B
    assert not cache.may_cross(BOUNDARY + 1, 30)  # long from the start: never crosses
    assert not PrefixCache(BS).may_cross(3, 30)  # no longrope


def test_a_request_that_may_cross_the_boundary_neither_reads_nor_names_blocks():
    """The shards recompute such a request whole with the long tables at the crossing,
    rewriting its blocks in place: they must be its own, and never named."""
    a = allocator(64, rope_regime_boundary=BOUNDARY)
    prompt = list(range(10, 17))  # 7 tokens: short

    def admit_whole(max_new: int):  # as the queue asks: with the positions it may reach
        match = a.match(prompt, "", len(prompt), len(prompt) + max_new)
        return a.allocate(len(prompt) + max_new, match)

    donor = admit_whole(1)  # 8 positions: cannot cross
    computed(a, donor, prompt + [50])
    assert a.cache.cached_blocks == 2
    crossing = admit_whole(3)  # 10 positions: runs its token at B (9 would not)
    assert crossing.cached_tokens == 0 and crossing.run is None
    assert not set(crossing.blocks) & set(donor.blocks)
    computed(a, crossing, prompt + [50, 51, 52, 53])  # the donor's tokens and more
    assert a.cache.cached_blocks == 2  # nothing of its own named
    a.free(crossing.blocks)
    assert a.free_blocks == 64 - 1 - len(donor.blocks)  # its blocks are plain free ones again
    assert admit_whole(1).cached_tokens == 4  # who cannot cross still reads the donor's
