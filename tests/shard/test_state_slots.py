"""Linear attention's state slots: which a new request takes (shard/state_slots.py) and how many
the pools hold (shard/kv_cache.py: plan_state_slots)."""

from __future__ import annotations

import pytest
import torch

from shard.kv_cache import KvCacheSettings, KvCacheTooLargeError, plan_state_slots
from shard.state_slots import StateSlotsExhaustedError, assign_state_slots

CPU = torch.device("cpu")
GIB = 2**30


def test_new_requests_take_the_lowest_slots_no_live_batch_holds():
    live = [torch.tensor([0, 3]), None, torch.tensor([1])]
    assert assign_state_slots(3, live, capacity=6).tolist() == [2, 4, 5]


def test_more_requests_than_free_slots_is_an_error_naming_the_limit():
    with pytest.raises(StateSlotsExhaustedError, match=r"2 new sequences .* 1 of 3 are free.*3"):
        assign_state_slots(2, [torch.tensor([0, 2])], capacity=3)


def settings(gib: float) -> KvCacheSettings:
    return KvCacheSettings(block_size=16, cuda_memory_fraction=0.9, cpu_kv_cache_gb=gib)


def test_the_routers_batch_size_is_held_whatever_it_costs():
    assert plan_state_slots(GIB, settings(1.0), CPU, requested=7, default=128) == 7


def test_without_one_the_default_or_what_half_the_cache_holds():
    assert plan_state_slots(1 << 20, settings(1.0), CPU, requested=0, default=128) == 128
    # 1 GiB of cache, half of it for states of 64 MiB: 8
    assert plan_state_slots(64 << 20, settings(1.0), CPU, requested=0, default=128) == 8
    with pytest.raises(KvCacheTooLargeError, match="linear-attention state"):
        plan_state_slots(GIB, settings(1.0), CPU, requested=0, default=128)
