"""The prefix cache and the allocator's shared blocks: what is matched, counted, kept, evicted."""

import pytest

from router.block_allocator import BlockAllocator
from router.prefix_cache import PrefixCache, reusable_prompt
from router.request import SamplingParams, ValidRequest

BS = 4


def allocator(blocks: int = 16) -> BlockAllocator:
    return BlockAllocator(blocks, BS, reserved=1, prefix_cache=PrefixCache(BS))


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
