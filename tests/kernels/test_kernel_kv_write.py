"""KV-cache write kernel against the torch reference backend's store."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, REFERENCE, PagedBatch, randn

from shard.platforms.cuda.kernels.kv_write import kv_write


@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_reference_store(dtype, head_dim):
    gen = torch.Generator().manual_seed(0)
    batch = PagedBatch.allocate([21, 5, 40], block_size=16)
    meta = batch.prefill_meta([0, 2, 30], [19, 5, 37])  # prefixes mean slots mid-block
    tokens = meta.slot_mapping.numel()
    # k and v as views of one fused projection: non-contiguous, as the model hands them over.
    kv = randn(tokens, 2, 3, head_dim, dtype=dtype, gen=gen)
    key, value = kv[:, 0, :2], kv[:, 1, 1:]
    cache = batch.empty_cache(2, head_dim, dtype)
    expected = cache.clone()
    kv_write(key, value, cache, meta.slot_mapping.to(torch.int32))  # int32 slots work too
    REFERENCE.store_kv(key, value, expected, meta.slot_mapping)
    # NaN stays NaN in the slots nobody wrote; equal_nan makes that part of the comparison.
    torch.testing.assert_close(cache, expected, rtol=0, atol=0, equal_nan=True)


def test_negative_slots_are_skipped():
    cache = torch.zeros(2, 2, 4, 1, 64, device=DEVICE)
    key = torch.ones(3, 1, 64, device=DEVICE)
    kv_write(key, 2 * key, cache, torch.tensor([5, -1, 0], device=DEVICE))
    written = (cache != 0).any(-1).flatten(1)  # [2, slots]
    assert written[:, [0, 5]].all() and int(written.sum()) == 4
    assert torch.all(cache[1].flatten(0, 1)[5] == 2)


def test_casts_to_the_cache_dtype():
    cache = torch.zeros(2, 1, 16, 1, 64, dtype=torch.float16, device=DEVICE)
    key = torch.full((1, 1, 64), 1.5, device=DEVICE)
    kv_write(key, key, cache, torch.tensor([3], device=DEVICE))
    assert torch.all(cache[:, 0, 3] == 1.5)
