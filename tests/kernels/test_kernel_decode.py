"""Paged decode kernel (plain and split-K) against the torch reference backend."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import (
    DTYPES,
    HEAD_DIMS,
    REFERENCE,
    TOLERANCES,
    PagedBatch,
    as_float,
    fill_cache,
    randn,
)

from shard.platforms.cuda.kernels.decode import (
    MAX_SPLITS,
    MIN_TOKENS_PER_SPLIT,
    choose_num_splits,
    paged_decode,
)


def decode_case(
    contexts: list[int],
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int,
    window: int | None = None,
    softcap: float | None = None,
    scale: float | None = None,
    chunk: int | None = None,
):
    gen = torch.Generator().manual_seed(seed)
    # Reserved beyond the context, as the router does: the block table is wider than needed.
    batch = PagedBatch.allocate([n + 9 for n in contexts], block_size=16, seed=seed)
    cache = batch.empty_cache(kv_heads, head_dim, dtype)
    fill_cache(batch, cache, contexts, gen)
    meta = batch.decode_meta(contexts)
    # A view of a fused projection, as in the model: strides are not those of a [B, H, D] tensor.
    q = randn(len(contexts), heads + 2 * kv_heads, head_dim, dtype=dtype, gen=gen)[:, :heads]
    ref_meta, ref_cache = as_float(meta, cache)
    scale = head_dim**-0.5 if scale is None else scale
    expected = REFERENCE.decode(
        q.float().cpu(), ref_cache, ref_meta, scale, window, softcap, chunk=chunk
    )
    return q, cache, meta, expected


def run_decode(
    contexts, heads, kv_heads, head_dim, dtype, num_splits, seed=0, window=None, chunk=None
) -> torch.Tensor:
    q, cache, meta, expected = decode_case(
        contexts, heads, kv_heads, head_dim, dtype, seed, window, chunk=chunk
    )
    out = paged_decode(
        q, cache, meta.block_tables, meta.context_lens, head_dim**-0.5,
        window=window, num_splits=num_splits, chunk=chunk,
    )  # fmt: skip
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float().cpu(), expected, **TOLERANCES[dtype])
    return out


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_and_head_dim(dtype, head_dim):
    run_decode([1, 17, 40], 4, 2, head_dim, dtype, num_splits=1)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 1), (8, 1)], ids=["mha", "gqa4", "mqa8"])
def test_gqa_ratios(heads, kv_heads, num_splits):
    run_decode([33, 16, 5], heads, kv_heads, 64, torch.float32, num_splits, seed=1)


@pytest.mark.parametrize("num_splits", [1, 2, 5])
@pytest.mark.parametrize("window", [1, 7, 16, 30])
def test_sliding_window(window, num_splits):
    # Contexts shorter than, equal to and longer than the windows; splits cut up the window,
    # so some splits of short windows hold no tokens.
    run_decode([3, 16, 30, 61], 8, 2, 64, torch.float32, num_splits, seed=4, window=window)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("chunk", [1, 8, 16, 30])
def test_attention_chunks(chunk, num_splits):
    # Queries at a chunk's first position, at its last, inside one, and before the first ends.
    run_decode([3, 16, 31, 61, 33], 8, 2, 64, torch.float32, num_splits, seed=11, chunk=chunk)


@pytest.mark.parametrize("num_splits", [2, 4])
def test_attention_chunks_split_per_sequence(num_splits):
    contexts = [25, 2, 64, 40]
    q, cache, meta, expected = decode_case(contexts, 4, 2, 64, torch.float32, seed=12, chunk=24)
    out = paged_decode(
        q, cache, meta.block_tables, meta.context_lens, 64**-0.5,
        chunk=24, num_splits=num_splits, split_per_sequence=True,
    )  # fmt: skip
    torch.testing.assert_close(out.float().cpu(), expected, **TOLERANCES[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_split_k_agrees_with_unsplit(dtype):
    # 6 splits of a 64-token table width: the 2-token sequence leaves splits with no tokens.
    contexts = [50, 2, 64]
    q, cache, meta, expected = decode_case(contexts, 4, 2, 64, dtype, seed=2)
    args = (q, cache, meta.block_tables, meta.context_lens, 64**-0.5)
    unsplit = paged_decode(*args, num_splits=1)
    for splits in (2, 6):
        split = paged_decode(*args, num_splits=splits)
        # Same math, summed in another order: fp32 agrees to rounding; 16-bit outputs to 1 ulp.
        tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=8e-3, rtol=8e-3)
        torch.testing.assert_close(split, unsplit, **tol)
        torch.testing.assert_close(split.float().cpu(), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_soft_capped_scores(dtype, window, num_splits):
    # Gemma 2's cap on the scaled scores: a scale of 1 puts them (unit q and k, head dim 64) at
    # ~8, well past the cap of 3. Split-K combines the splits' sums of capped scores.
    contexts, scale, softcap = [3, 16, 30, 61], 1.0, 3.0
    case = (contexts, 8, 2, 64, dtype, 9)
    q, cache, meta, expected = decode_case(*case, window=window, softcap=softcap, scale=scale)
    out = paged_decode(
        q, cache, meta.block_tables, meta.context_lens, scale,
        window=window, softcap=softcap, num_splits=num_splits,
    )  # fmt: skip
    torch.testing.assert_close(out.float().cpu(), expected, **TOLERANCES[dtype])
    _, _, _, uncapped = decode_case(*case, window=window, scale=scale)
    assert (expected - uncapped).abs().max() > 10 * TOLERANCES[dtype]["atol"]


def test_heuristic_picks_the_plain_kernel_when_the_grid_fills_the_gpu():
    # Batch 64 x 8 KV heads = 512 programs on an H100's 132 SMs: splitting only adds the reduce.
    assert choose_num_splits(64, 8, 4096, sms=132) == 1
    # Short contexts are not worth a reduce even with idle SMs.
    assert choose_num_splits(1, 8, 2 * MIN_TOKENS_PER_SPLIT - 1, sms=132) == 1


def test_heuristic_splits_long_contexts_of_few_sequences():
    splits = choose_num_splits(1, 8, 4096, sms=132)
    assert 1 < splits <= 4096 // MIN_TOKENS_PER_SPLIT
    assert choose_num_splits(1, 1, 1 << 20, sms=132) == MAX_SPLITS
    # More sequences, fewer splits needed to fill the GPU.
    assert choose_num_splits(4, 8, 4096, sms=132) <= splits


def test_automatic_choice_runs():
    q, cache, meta, expected = decode_case([3, 20], 4, 2, 64, torch.float32, seed=3)
    out = paged_decode(q, cache, meta.block_tables, meta.context_lens, 64**-0.5)
    torch.testing.assert_close(out.cpu(), expected, **TOLERANCES[torch.float32])


@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("num_splits", [1, 3, 7])
def test_splits_per_sequence_agree_with_the_reference(num_splits, window):
    # CUDA graphs' decode: each sequence cuts its own context (or window) into the splits. The
    # contexts span 1 token to several tiles, so some sequences leave most splits empty and
    # others give every split several tiles.
    contexts = [1, 2, 17, 64, 150]
    q, cache, meta, expected = decode_case(contexts, 4, 2, 64, torch.float32, seed=5, window=window)
    out = paged_decode(
        q, cache, meta.block_tables, meta.context_lens, 64**-0.5,
        window=window, num_splits=num_splits, split_per_sequence=True,
    )  # fmt: skip
    torch.testing.assert_close(out.cpu(), expected, **TOLERANCES[torch.float32])
