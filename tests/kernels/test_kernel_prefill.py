"""Varlen causal prefill kernel against the torch reference backend."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import (
    DEVICE,
    DTYPES,
    HEAD_DIMS,
    REFERENCE,
    TOLERANCES,
    PagedBatch,
    as_float,
    fill_cache,
    randn,
)

from shard.platforms.cuda.kernels.prefill import PrefillConfig, varlen_prefill


def run_prefill(
    prefixes: list[int],
    new_lens: list[int],
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    *,
    block_size: int = 16,
    config: PrefillConfig | None = None,
    window: int | None = None,
    softcap: float | None = None,
    scale: float | None = None,
    chunk: int | None = None,
    seed: int = 0,
) -> None:
    """Prefill of new_lens[i] tokens after prefixes[i] cached ones, compared with the reference.
    With `softcap`, also checks that the cap moved the output by far more than the tolerance."""
    gen = torch.Generator().manual_seed(seed)
    totals = [p + n for p, n in zip(prefixes, new_lens, strict=True)]
    batch = PagedBatch.allocate([t + 3 for t in totals], block_size, seed=seed)
    cache = batch.empty_cache(kv_heads, head_dim, dtype)
    fill_cache(batch, cache, prefixes, gen)
    meta = batch.prefill_meta(prefixes, totals)
    tokens = sum(new_lens)
    # q/k/v as views of one fused projection, as the model hands them over (non-unit strides).
    qkv = randn(tokens, heads + 2 * kv_heads, head_dim, dtype=dtype, gen=gen)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    REFERENCE.store_kv(k, v, cache, meta.slot_mapping)
    scale = head_dim**-0.5 if scale is None else scale
    out = varlen_prefill(
        q, k, v, meta.cu_seqlens_q, meta.cu_seqlens_q, meta.max_seqlen_q, scale,
        kv_cache=cache, block_tables=meta.block_tables, context_lens=meta.context_lens,
        window=window, softcap=softcap, chunk=chunk, config=config,
    )  # fmt: skip
    ref_meta, ref_cache = as_float(meta, cache)
    ref_qkv = (q.float().cpu(), k.float().cpu(), v.float().cpu(), ref_cache, ref_meta, scale)
    expected = REFERENCE.prefill(*ref_qkv, window, softcap, chunk=chunk)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float().cpu(), expected, **TOLERANCES[dtype])
    if softcap:
        uncapped = REFERENCE.prefill(*ref_qkv, window)
        assert (expected - uncapped).abs().max() > 10 * TOLERANCES[dtype]["atol"]


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_and_head_dim_with_ragged_lengths_and_cached_prefix(dtype, head_dim):
    # Lengths off the 16-token tile and block grid; one sequence without a prefix, one whose
    # prefix ends mid-block, one whose prefix spans several blocks.
    run_prefill([0, 7, 20], [5, 21, 18], heads=4, kv_heads=2, head_dim=head_dim, dtype=dtype)


@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 1), (8, 1)], ids=["mha", "gqa4", "mqa8"])
def test_gqa_ratios(heads, kv_heads):
    run_prefill([3, 0], [30, 17], heads, kv_heads, head_dim=64, dtype=torch.float32, seed=1)


@pytest.mark.parametrize("block_size", [8, 32])
def test_cache_block_size_other_than_the_tile(block_size):
    # 8: one key tile spans two cache blocks; 32: one cache block spans two key tiles.
    run_prefill([40, 9], [12, 33], 4, 2, 64, torch.float32, block_size=block_size, seed=2)


def test_exact_tile_multiples_and_single_tokens():
    run_prefill([16, 0, 0], [16, 32, 1], 2, 1, 64, torch.float16, seed=3)


def test_larger_tiles_than_the_sequences():
    # The GPU's tile shape on interpreter-sized inputs: everything fits in one diagonal tile.
    cfg = PrefillConfig(block_m=64, block_n=32, num_warps=4, num_stages=1)
    run_prefill([5, 0], [9, 40], 4, 2, 80, torch.float32, config=cfg, seed=4)


@pytest.mark.parametrize("chunk", [1, 6, 16, 23, 40])
def test_attention_chunks(chunk):
    # Chunks inside one tile, of exactly one tile, across tiles, and longer than some contexts;
    # chunk starts in the cached prefix, in the new keys, inside a query tile (so the rows of
    # one tile see different chunks), or nowhere.
    run_prefill([0, 7, 30, 45], [37, 21, 18, 3], 4, 2, 64, torch.float32, chunk=chunk, seed=9)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_attention_chunks_16_bit_with_the_gpu_tile_shape(dtype):
    cfg = PrefillConfig(block_m=64, block_n=32, num_warps=4, num_stages=1)
    run_prefill([50, 0], [20, 70], 8, 1, 128, dtype, config=cfg, chunk=24, seed=10)


@pytest.mark.parametrize("window", [1, 5, 16, 23, 40])
def test_sliding_window(window):
    # Windows inside one tile, of exactly one tile, across tiles, and wider than some contexts;
    # prefixes shorter and longer than the window (so the window starts in the cached prefix,
    # in the new keys, or not at all).
    run_prefill([0, 7, 30, 45], [37, 21, 18, 3], 4, 2, 64, torch.float32, window=window, seed=6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_sliding_window_16_bit_with_the_gpu_tile_shape(dtype):
    cfg = PrefillConfig(block_m=64, block_n=32, num_warps=4, num_stages=1)
    run_prefill([50, 0], [20, 70], 8, 1, 128, dtype, config=cfg, window=9, seed=7)


@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_soft_capped_scores(dtype, window):
    # Gemma 2's cap on the scaled scores, before every mask: a scale of 1 puts the scores (unit
    # q and k, head dim 64) at ~8, well past the cap of 3. The cached prefix, the unmasked
    # tiles and the diagonal all take it.
    run_prefill(
        [0, 7, 30], [37, 21, 18], 4, 2, 64, dtype, window=window, softcap=3.0, scale=1.0, seed=8
    )


def test_without_cache_and_longer_keys_than_queries():
    """No paged cache, separate cu_seqlens_k: causal alignment is bottom-right (query j of a
    sequence with q_len queries and k_len keys sees keys 0 .. j + k_len - q_len)."""
    gen = torch.Generator().manual_seed(5)
    q_lens, k_lens = [3, 19, 8], [10, 19, 30]
    heads, kv_heads, d = 4, 2, 64
    q = randn(sum(q_lens), heads, d, dtype=torch.float32, gen=gen)
    k = randn(sum(k_lens), kv_heads, d, dtype=torch.float32, gen=gen)
    v = randn(sum(k_lens), kv_heads, d, dtype=torch.float32, gen=gen)
    cu_q = torch.tensor([0] + q_lens, device=DEVICE).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + k_lens, device=DEVICE).cumsum(0).to(torch.int32)
    out = varlen_prefill(q, k, v, cu_q, cu_k, max(q_lens), 0.2)
    for i in range(len(q_lens)):
        qi = q[cu_q[i] : cu_q[i + 1]].transpose(0, 1)
        ki, vi = (t[cu_k[i] : cu_k[i + 1]].transpose(0, 1) for t in (k, v))
        mask = torch.ones(q_lens[i], k_lens[i], dtype=torch.bool).tril(k_lens[i] - q_lens[i])
        expected = torch.nn.functional.scaled_dot_product_attention(
            qi.cpu(), ki.cpu(), vi.cpu(), attn_mask=mask, scale=0.2, enable_gqa=True
        ).transpose(0, 1)
        got = out[cu_q[i] : cu_q[i + 1]].cpu()
        torch.testing.assert_close(got, expected, **TOLERANCES[torch.float32])
