"""Paged attention for decode: one new query token per sequence over its block table.

One program per (sequence, KV head[, split]) handles *all* query heads of that KV head's group
as the rows of one tile, so each K/V tile is read from HBM once per group rather than once per
query head, and the scores are a [group, BLOCK_N] matmul instead of group matrix-vector products.
Groups smaller than 16 rows are padded (tl.dot's minimum); decode is bandwidth-bound, so the
padded rows cost tensor-core time that is free, not memory traffic.

Split-K (flash-decoding): with few sequences the (sequence, KV head) grid leaves most SMs idle,
so the context is cut into `num_splits` contiguous ranges processed in parallel, each writing a
partial result that `decode_reduce` combines. `choose_num_splits` decides.

Sliding-window layers (SLIDING) start each sequence's loop at its window's first position, so a
long context costs only its window; the splits cut up the window. Chunked layers (CHUNKED,
Llama 4's local layers) likewise start at the first position of the query's chunk.

Soft-capped layers (SOFTCAP, Gemma 2) cap every score before the softmax
(shard/platforms/cuda/kernels/ softmax.py); the splits' log-sum-exps are of the capped scores, so
the reduce is unchanged.

Attention sinks (SINKS, gpt-oss): each query head's sink logit joins its softmax's denominator
once: unsplit, at the end of the loop against the running max; split, in the reduce, as one
more part whose log-sum-exp is the sink and whose output is zero.

ALiBi (ALIBI, BLOOM, MPT): each head's scores gain its slope * (key position - query position)
after the cap; the splits' log-sum-exps are of the biased scores, so the reduce is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch
import triton
import triton.language as tl

from shard.platforms.cuda.kernels import check_device, dot_options, head_block, interpreting
from shard.platforms.cuda.kernels.decode_reduce import decode_reduce
from shard.platforms.cuda.kernels.softmax import (
    alibi_bias,
    attend_tile,
    check_alibi,
    check_sinks,
    score_scales,
)

# A split shorter than this spends more on its partial write and the reduce than it saves.
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 32
# Aim for about this many resident programs per SM once split: one wave hides little latency.
WAVES = 2


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    sinks_ptr,
    alibi_ptr,
    scale_log2,
    softcap_log2,
    tokens_per_split,
    window,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_ob,
    stride_oh,
    stride_od,
    stride_c_kv,
    stride_c_blk,
    stride_c_off,
    stride_c_h,
    stride_c_d,
    stride_bt,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CACHE_BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLIT_PER_SEQUENCE: tl.constexpr,
    SLIDING: tl.constexpr,
    CHUNKED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
    ALIBI: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    context_len = tl.load(context_lens_ptr + seq)
    # The first position the query sees: splits cut up the window (or the query's chunk), not
    # the whole context.
    first_pos = 0
    if SLIDING:
        first_pos = tl.maximum(context_len - window, 0)
    if CHUNKED:  # the query is at position context_len - 1
        first_pos = (context_len - 1) // window * window
    if SPLIT_PER_SEQUENCE:
        # Each sequence's own span cut into NUM_SPLITS (whole tiles): the grid was sized for
        # the longest context the block table can hold, not for this step's contexts.
        span = context_len - first_pos
        tokens_per_split = tl.cdiv(tl.cdiv(span, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = first_pos + split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, context_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g[:, None] < GROUP
    d_mask = offs_d[None, :] < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=g_mask & d_mask,
        other=0.0,
    )

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_off = kv_head * stride_c_h + offs_d[None, :] * stride_c_d
    slopes = tl.zeros([BLOCK_G], dtype=tl.float32)
    if ALIBI:  # each row's head's slope; the query is at position context_len - 1
        slopes = tl.load(alibi_ptr + heads, mask=offs_g < GROUP, other=0.0)
    # Every tile starts below `end`, so no tile is fully masked (see attend_tile).
    for start_n in range(start, end, BLOCK_N):
        pos = start_n + offs_n
        valid = pos < end
        block = tl.load(bt_row + pos // CACHE_BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        rows = block * stride_c_blk + (pos % CACHE_BLOCK_SIZE) * stride_c_off
        ptrs = cache_ptr + rows[:, None] + head_off
        k = tl.load(ptrs, mask=valid[:, None] & d_mask, other=0.0)
        v = tl.load(ptrs + stride_c_kv, mask=valid[:, None] & d_mask, other=0.0)
        bias = None
        if ALIBI:
            bias = alibi_bias(slopes[:, None], pos[None, :], context_len - 1)
        m_i, l_i, acc = attend_tile(
            q,
            k,
            v,
            m_i,
            l_i,
            acc,
            valid[None, :],
            scale_log2,
            softcap_log2,
            MASKED=True,
            SOFTCAP=SOFTCAP,
            DOT_PRECISION=DOT_PRECISION,
            DOT_UPCAST=DOT_UPCAST,
            bias=bias,
            BIASED=ALIBI,
        )

    if NUM_SPLITS == 1:
        if SINKS:  # the sink in base 2 (log2(e)), against the same max as the sum
            sink = tl.load(sinks_ptr + heads, mask=offs_g < GROUP, other=0.0)
            l_i += tl.exp2(sink * 1.4426950408889634 - m_i)
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + seq * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=g_mask & d_mask,
        )
    else:
        # A split past the sequence's end ran no tile: l_i = 0. It must come out as o = 0,
        # lse = -inf (weight 0 in the reduce), without a 0/0 on the way.
        has_keys = l_i > 0
        l_safe = tl.where(has_keys, l_i, 1.0)
        lse = tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))
        part_row = (seq.to(tl.int64) * NUM_HEADS + heads) * NUM_SPLITS + split
        tl.store(part_lse_ptr + part_row, lse, mask=offs_g < GROUP)
        tl.store(
            part_out_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :],
            acc / l_safe[:, None],
            mask=g_mask & d_mask,
        )


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int
    num_warps: int
    num_stages: int


def default_decode_config(head_dim: int) -> DecodeConfig:
    if interpreting():
        return DecodeConfig(16, 1, 1)
    # Not yet tuned on a GPU (see docs/kernels.md). Heads past 128 dims take 8 warps (at 4 the
    # [BLOCK_N, D] tiles spill registers: ~1.1 KiB of stack at 256) and at 512 half the tile.
    if head_dim > 256:
        return DecodeConfig(32, 8, 2)
    if head_dim > 128:
        return DecodeConfig(64, 8, 2)
    return DecodeConfig(64, 4, 2)


@cache
def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the interpreter has no SMs; plan as for an H100 so the choice is the same
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, sms: int) -> int:
    """1 (no split) when the (sequence, KV head) grid already fills the GPU or the context is
    short; otherwise enough splits for about WAVES programs per SM, each at least
    MIN_TOKENS_PER_SPLIT tokens long."""
    programs = batch * num_kv_heads
    if programs >= sms or max_context < 2 * MIN_TOKENS_PER_SPLIT:
        return 1
    wanted = triton.cdiv(WAVES * sms, programs)
    return max(1, min(wanted, max_context // MIN_TOKENS_PER_SPLIT, MAX_SPLITS))


def paged_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
    alibi: torch.Tensor | None = None,
    num_splits: int | None = None,
    config: DecodeConfig | None = None,
    split_per_sequence: bool = False,
) -> torch.Tensor:
    """q [B, H, D] against each sequence's first context_lens[b] cached tokens -> [B, H, D];
    with `window`, against only the last `window` of them; with `chunk`, against only those of
    the query's own chunk (from its position rounded down to a multiple of `chunk`). With
    `softcap` (None or 0: off), each scaled score s becomes softcap * tanh(s / softcap) before
    the softmax (Gemma 2). With `sinks` ([H] float32, gpt-oss), head h's softmax denominator
    also counts exp(sinks[h]). With `alibi` ([H] float32 slopes, BLOOM, MPT), head h adds
    alibi[h] * (key position - query position) to each (capped) score.

    `num_splits=None` lets `choose_num_splits` decide. Its context bound is the block table's
    width (or the window, if smaller), known on the host, so deciding costs no device-to-host
    sync.

    `split_per_sequence`: each sequence cuts its own context (or window) into the splits, read
    on the device, instead of every sequence using splits sized for the table's width. For a
    CUDA graph, whose block table is as wide as the longest request can be whatever the step's
    contexts are: it keeps the splits busy without reading the contexts on the host.
    """
    batch, num_heads, head_dim = q.shape
    _, _, cache_block_size, num_kv_heads, _ = kv_cache.shape
    out = torch.empty_like(q)
    if batch == 0:
        return out
    check_device(q, kv_cache, block_tables, context_lens)
    if sinks is not None:
        check_device(sinks)
        check_sinks(sinks, num_heads)
    if alibi is not None:
        check_device(alibi)
        check_alibi(alibi, num_heads)
    group = num_heads // num_kv_heads
    cfg = config or default_decode_config(head_dim)
    max_context = block_tables.shape[1] * cache_block_size
    if window is not None and chunk is not None:
        raise ValueError("a layer attends in a sliding window or in chunks, not both")
    span = window or chunk
    if span is not None:
        max_context = min(max_context, span)
    if num_splits is None:
        num_splits = choose_num_splits(batch, num_kv_heads, max_context, num_sms(q.device))
    tokens_per_split = triton.cdiv(triton.cdiv(max_context, num_splits), cfg.block_n) * cfg.block_n
    if num_splits > 1:
        part_out = torch.empty(
            batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused: the split branch is compiled out
    scale_log2, softcap_log2 = score_scales(scale, softcap)
    _paged_decode_kernel[(batch, num_kv_heads, num_splits)](
        q,
        kv_cache,
        block_tables,
        context_lens,
        out,
        part_out,
        part_lse,
        q if sinks is None else sinks,  # a dummy where SINKS is compiled out
        q if alibi is None else alibi,  # likewise where ALIBI is
        scale_log2,
        softcap_log2,
        tokens_per_split,
        span or 0,
        *q.stride(),
        *out.stride(),
        *kv_cache.stride(),
        block_tables.stride(0),
        NUM_HEADS=num_heads,
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=head_block(head_dim),
        BLOCK_N=cfg.block_n,
        CACHE_BLOCK_SIZE=cache_block_size,
        NUM_SPLITS=num_splits,
        SPLIT_PER_SEQUENCE=split_per_sequence,
        SLIDING=window is not None,
        CHUNKED=chunk is not None,
        SOFTCAP=bool(softcap),
        SINKS=sinks is not None,
        ALIBI=alibi is not None,
        **dot_options(q.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if num_splits > 1:
        decode_reduce(part_out, part_lse, out, sinks)
    return out
