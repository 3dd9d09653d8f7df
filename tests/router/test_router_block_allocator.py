import pytest

from router.block_allocator import BlockAllocator


def _check_slots(alloc, n_tokens: int, block_size: int) -> None:
    assert len(alloc.slots) == n_tokens
    for p, slot in enumerate(alloc.slots):
        assert slot == alloc.blocks[p // block_size] * block_size + p % block_size


def test_allocate_rounds_up_to_blocks_and_maps_every_position():
    a = BlockAllocator(num_blocks=10, block_size=4)
    alloc = a.allocate(9)
    assert alloc is not None and len(alloc.blocks) == 3
    _check_slots(alloc, 9, 4)
    assert a.free_blocks == 7 and a.used_blocks == 3


def test_reserved_blocks_are_never_handed_out():
    a = BlockAllocator(num_blocks=5, block_size=2, reserved=1)
    assert a.capacity_blocks == 4
    alloc = a.allocate(8)
    assert alloc is not None and 0 not in alloc.blocks
    assert a.allocate(1) is None


def test_returns_none_when_not_enough_and_recovers_after_free():
    a = BlockAllocator(num_blocks=4, block_size=4)
    first = a.allocate(12)
    assert first is not None
    assert a.allocate(5) is None  # needs 2 blocks, 1 free
    assert a.free_blocks == 1  # a failed allocation takes nothing
    a.free(first.blocks)
    second = a.allocate(16)
    assert second is not None and sorted(second.blocks) == [0, 1, 2, 3]


def test_allocations_never_overlap():
    a = BlockAllocator(num_blocks=32, block_size=3)
    live = []
    for n in (1, 3, 4, 7, 10, 2, 5):
        alloc = a.allocate(n)
        assert alloc is not None
        _check_slots(alloc, n, 3)
        live.append(alloc)
    a.free(live.pop(2).blocks)
    a.free(live.pop(0).blocks)
    live.append(a.allocate(11))
    blocks = [b for alloc in live for b in alloc.blocks]
    assert len(blocks) == len(set(blocks))
    assert a.used_blocks == len(blocks)
    assert a.free_blocks + a.used_blocks == 32


def test_double_free_and_unknown_blocks_are_errors():
    a = BlockAllocator(num_blocks=4, block_size=2)
    alloc = a.allocate(3)
    a.free(alloc.blocks)
    with pytest.raises(ValueError):
        a.free(alloc.blocks)
    with pytest.raises(ValueError):
        a.free([3])
    other = a.allocate(2)
    with pytest.raises(ValueError):
        a.free([other.blocks[0], other.blocks[0]])


def test_invalid_arguments():
    with pytest.raises(ValueError):
        BlockAllocator(num_blocks=4, block_size=0)
    with pytest.raises(ValueError):
        BlockAllocator(num_blocks=4, block_size=2).allocate(0)
