"""Packed variable-length causal flash attention for prefill, with an optional cached prefix.

One program per (BLOCK_M query rows, sequence, query head). The program's K/V head is
`head // group`, so GQA/MQA read the shared K/V head directly and never repeat it in memory.

Keys of sequence i come from two places, in position order:
  1. a cached prefix of `context_lens[i] - k_len` tokens, read from the paged cache through the
     block table (prefix caching, chunked prefill); every query sees all of it;
  2. the k_len packed new keys of this step, causal with the bottom-right alignment of
     flash-attention 2 (query j sees new keys 0 .. j + k_len - q_len).
The packed part is split into tiles every row of the block sees (no mask, the bulk of the work)
and the tiles along the diagonal (masked), so the mask costs nothing off the diagonal.

Sliding-window layers (SLIDING, Mistral; Qwen2's sliding layers): a query sees only the keys less
than `window` positions before it. Chunked layers (CHUNKED, Llama 4's local layers): a query sees
only the keys of its own chunk of `window` positions (those from its position rounded down to a
multiple of `window`). Either way the first key a row sees rises with the row, so tiles wholly
before the block's first row's first key are never read, and the tiles where the block's rows'
first keys lie are masked like the diagonal.

Soft-capped layers (SOFTCAP, Gemma 2): every score is capped before the masks and the softmax
(shard/platforms/cuda/kernels/softmax.py); off, the kernel is the same as without the option.

Attention sinks (SINKS, gpt-oss): each query head's sink logit joins its softmax's denominator
once the keys are folded in, 2^(sink log2(e) - m) against the running max m, as if a last key
without a value; off, the kernel is the same as without the option.

ALiBi (ALIBI, BLOOM, MPT): each score of head h gains slopes[h] * (key position - query
position) after the cap, in every tile (cached, unmasked and diagonal alike); off, the kernel is
the same as without the option.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from shard.platforms.cuda.kernels import check_device, dot_options, head_block, interpreting
from shard.platforms.cuda.kernels.softmax import (
    alibi_bias,
    attend_tile,
    check_alibi,
    check_sinks,
    score_scales,
)


@triton.jit
def _first_seen(position, window, CHUNKED: tl.constexpr):
    """The first position the query at `position` sees: in its sliding window, or (CHUNKED) in
    its chunk of `window` positions."""
    if CHUNKED:
        return position // window * window
    return position - window + 1


@triton.jit
def _masked_new_keys(
    q,
    m_i,
    l_i,
    acc,
    k_base,
    v_base,
    lo,
    hi,
    k_start,
    k_len,
    shift,
    prefix,
    window,
    offs_m,
    offs_n,
    d_mask,
    stride_kt,
    stride_vt,
    scale_log2,
    softcap_log2,
    slope,
    BLOCK_N: tl.constexpr,
    SLIDING: tl.constexpr,
    CHUNKED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    ALIBI: tl.constexpr,
):
    """Folds in the packed new keys lo .. hi with every mask applied: the causal diagonal, the
    sequence's end and (SLIDING, CHUNKED) the row's first key. Query row m (at position
    prefix + shift + m) sees new key n (at prefix + n) when n <= m + shift and, with a window or
    chunks, prefix + n >= its first position seen."""
    for start_n in range(lo, hi, BLOCK_N):
        pos = start_n + offs_n
        valid = pos < k_len
        rows = (k_start + pos).to(tl.int64)[:, None]
        k = tl.load(k_base + rows * stride_kt, mask=valid[:, None] & d_mask, other=0.0)
        v = tl.load(v_base + rows * stride_vt, mask=valid[:, None] & d_mask, other=0.0)
        seen = (pos[None, :] <= offs_m[:, None] + shift) & valid[None, :]
        if SLIDING or CHUNKED:
            first = _first_seen(prefix + shift + offs_m[:, None], window, CHUNKED)
            seen = seen & (prefix + pos[None, :] >= first)
        bias = None
        if ALIBI:
            bias = alibi_bias(slope, pos[None, :], offs_m[:, None] + shift)
        m_i, l_i, acc = attend_tile(
            q,
            k,
            v,
            m_i,
            l_i,
            acc,
            seen,
            scale_log2,
            softcap_log2,
            MASKED=True,
            SOFTCAP=SOFTCAP,
            DOT_PRECISION=DOT_PRECISION,
            DOT_UPCAST=DOT_UPCAST,
            bias=bias,
            BIASED=ALIBI,
        )
    return m_i, l_i, acc


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    cu_seqlens_q_ptr,
    cu_seqlens_k_ptr,
    sinks_ptr,
    alibi_ptr,
    scale_log2,
    softcap_log2,
    window,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_c_kv,
    stride_c_blk,
    stride_c_off,
    stride_c_h,
    stride_c_d,
    stride_bt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CACHE_BLOCK_SIZE: tl.constexpr,
    HAS_PREFIX: tl.constexpr,
    SLIDING: tl.constexpr,
    CHUNKED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
    ALIBI: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    start_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    kv_head = head // GROUP

    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    # The grid is sized for the longest sequence; shorter ones leave programs with nothing to do.
    if start_m * BLOCK_M >= q_len:
        return
    k_start = tl.load(cu_seqlens_k_ptr + seq)
    k_len = tl.load(cu_seqlens_k_ptr + seq + 1) - k_start
    shift = k_len - q_len

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM
    m_mask = offs_m[:, None] < q_len

    q_rows = (q_start + offs_m).to(tl.int64)[:, None] * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_rows + offs_d[None, :] * stride_qd, mask=m_mask & d_mask, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    slope = 0.0
    if ALIBI:
        slope = tl.load(alibi_ptr + head)

    # the cached tokens before the new keys: new key n is at position prefix + n
    prefix = k_len * 0
    if HAS_PREFIX:
        prefix = tl.load(context_lens_ptr + seq) - k_len
        bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
        first_pos = 0
        if SLIDING or CHUNKED:  # the first position the block's first row sees
            first_row = prefix + shift + start_m * BLOCK_M
            first_pos = tl.maximum(_first_seen(first_row, window, CHUNKED), 0)
        for start_n in range(first_pos, prefix, BLOCK_N):
            pos = start_n + offs_n
            valid = pos < prefix
            block = tl.load(bt_row + pos // CACHE_BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
            rows = block * stride_c_blk + (pos % CACHE_BLOCK_SIZE) * stride_c_off
            ptrs = cache_ptr + rows[:, None] + kv_head * stride_c_h + offs_d[None, :] * stride_c_d
            kv_mask = valid[:, None] & d_mask
            k = tl.load(ptrs, mask=kv_mask, other=0.0)
            v = tl.load(ptrs + stride_c_kv, mask=kv_mask, other=0.0)
            seen = valid[None, :]
            if SLIDING or CHUNKED:  # row m is at position prefix + shift + m
                first = _first_seen(prefix + shift + offs_m[:, None], window, CHUNKED)
                seen = seen & (pos[None, :] >= first)
            bias = None
            if ALIBI:  # against positions relative to the first new key (prefix)
                bias = alibi_bias(slope, pos[None, :] - prefix, offs_m[:, None] + shift)
            m_i, l_i, acc = attend_tile(
                q,
                k,
                v,
                m_i,
                l_i,
                acc,
                seen,
                scale_log2,
                softcap_log2,
                MASKED=True,
                SOFTCAP=SOFTCAP,
                DOT_PRECISION=DOT_PRECISION,
                DOT_UPCAST=DOT_UPCAST,
                bias=bias,
                BIASED=ALIBI,
            )

    k_base = k_ptr + kv_head * stride_kh + offs_d[None, :] * stride_kd
    v_base = v_ptr + kv_head * stride_vh + offs_d[None, :] * stride_vd
    # Keys below `full_end` are visible to every row of this block: no causal or length mask.
    full_end = tl.minimum(start_m * BLOCK_M + shift + 1, k_len) // BLOCK_N * BLOCK_N
    # The diagonal: the last row of the block sees keys up to (start_m + 1) * BLOCK_M - 1 + shift.
    diag_end = tl.minimum((start_m + 1) * BLOCK_M + shift, k_len)
    # With a sliding window or chunks, keys from `full_start` on are seen by every row (the
    # last row's first key seen is the highest); the tiles between the first row's first key
    # and there are masked.
    full_start = 0
    if SLIDING or CHUNKED:
        first_row = prefix + shift + start_m * BLOCK_M
        first_key = tl.maximum(_first_seen(first_row, window, CHUNKED) - prefix, 0)
        first_key = first_key // BLOCK_N * BLOCK_N
        last_row = first_row + BLOCK_M - 1
        last_row_first_key = tl.maximum(_first_seen(last_row, window, CHUNKED) - prefix, 0)
        full_start = tl.cdiv(last_row_first_key, BLOCK_N) * BLOCK_N
        m_i, l_i, acc = _masked_new_keys(
            q, m_i, l_i, acc, k_base, v_base, first_key, tl.minimum(full_start, diag_end),
            k_start, k_len, shift, prefix, window, offs_m, offs_n, d_mask, stride_kt, stride_vt,
            scale_log2, softcap_log2, slope, BLOCK_N, SLIDING, CHUNKED, SOFTCAP, DOT_PRECISION,
            DOT_UPCAST, ALIBI,
        )  # fmt: skip
    for start_n in range(full_start, full_end, BLOCK_N):
        rows = (k_start + start_n + offs_n).to(tl.int64)[:, None]
        if BLOCK_D == HEAD_DIM:  # the hot loop: no mask at all when the head dim needs no pad
            k = tl.load(k_base + rows * stride_kt)
            v = tl.load(v_base + rows * stride_vt)
        else:
            k = tl.load(k_base + rows * stride_kt, mask=d_mask, other=0.0)
            v = tl.load(v_base + rows * stride_vt, mask=d_mask, other=0.0)
        bias = None
        if ALIBI:
            bias = alibi_bias(slope, (start_n + offs_n)[None, :], offs_m[:, None] + shift)
        m_i, l_i, acc = attend_tile(
            q,
            k,
            v,
            m_i,
            l_i,
            acc,
            None,
            scale_log2,
            softcap_log2,
            MASKED=False,
            SOFTCAP=SOFTCAP,
            DOT_PRECISION=DOT_PRECISION,
            DOT_UPCAST=DOT_UPCAST,
            bias=bias,
            BIASED=ALIBI,
        )
    m_i, l_i, acc = _masked_new_keys(
        q, m_i, l_i, acc, k_base, v_base, tl.maximum(full_end, full_start), diag_end,
        k_start, k_len, shift, prefix, window, offs_m, offs_n, d_mask, stride_kt, stride_vt,
        scale_log2, softcap_log2, slope, BLOCK_N, SLIDING, CHUNKED, SOFTCAP, DOT_PRECISION,
        DOT_UPCAST, ALIBI,
    )  # fmt: skip

    if SINKS:  # the sink in base 2 (log2(e)), against the same max as the sum
        l_i += tl.exp2(tl.load(sinks_ptr + head) * 1.4426950408889634 - m_i)
    # Padding rows past q_len may have seen no key at all (a window); they are never stored.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = (q_start + offs_m).to(tl.int64)[:, None] * stride_ot + head * stride_oh
    tl.store(
        o_ptr + o_rows + offs_d[None, :] * stride_od,
        out.to(o_ptr.dtype.element_ty),
        mask=m_mask & d_mask,
    )


@dataclass(frozen=True)
class PrefillConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def default_prefill_config(head_dim: int, dtype: torch.dtype) -> PrefillConfig:
    if interpreting():
        # The interpreter's cost is per tile operation, not per element; 16x16 tiles keep the
        # test shapes multi-tile (so the online softmax and the masks are really exercised).
        return PrefillConfig(16, 16, 1, 1)
    if dtype == torch.float32:
        # fp32 tiles are twice the bytes: 128x64 with 3 stages needs ~225 KB of shared memory
        # at head dim 128 (an H100's whole budget; more than an A100 has).
        return PrefillConfig(64, 32, 4, 2)
    # Not yet tuned on a GPU (see docs/kernels.md): flash-attention 2's usual Hopper/Ampere
    # shape, 8 warps once the head dim makes the [M, D] accumulator large. Wider heads (Gemma's
    # 256, Gemma 4's global 512) take smaller tiles and two stages: at 512 the usual shape needs
    # 256 KiB of shared memory, more than an H100 has; these need 96 and 128 KiB (compiled for
    # sm_90 by tests/kernels/gpu_compile.py).
    if head_dim > 256:
        return PrefillConfig(64, 32, 8, 2)
    if head_dim > 128:
        return PrefillConfig(64, 64, 8, 2)
    return PrefillConfig(128, 64, 8 if head_dim > 64 else 4, 3)


def varlen_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    scale: float,
    *,
    kv_cache: torch.Tensor | None = None,
    block_tables: torch.Tensor | None = None,
    context_lens: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
    alibi: torch.Tensor | None = None,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """Causal attention of packed queries q [Tq, H, D] over packed keys/values k, v [Tk, Hkv, D]
    (sequence i is rows cu_seqlens[i]:cu_seqlens[i+1]; k_len >= q_len per sequence).

    With kv_cache/block_tables/context_lens, sequence i first attends to the
    `context_lens[i] - k_len` cached tokens before its new keys. With `window`, a query sees
    only the keys less than `window` positions before it; with `chunk`, only the keys of its own
    chunk (positions c * chunk .. (c + 1) * chunk - 1). With `softcap` (None or 0: off), each
    scaled score s becomes softcap * tanh(s / softcap) before the masks and the softmax (Gemma
    2). With `sinks` ([H] float32, gpt-oss), head h's softmax denominator also counts
    exp(sinks[h]). With `alibi` ([H] float32 slopes, BLOOM, MPT), head h adds
    alibi[h] * (key position - query position) to each (capped) score. Returns [Tq, H, D] in
    q's dtype.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if window is not None and chunk is not None:
        raise ValueError("a layer attends in a sliding window or in chunks, not both")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    out = torch.empty_like(q)
    batch = cu_seqlens_q.numel() - 1
    if num_tokens == 0 or batch == 0:
        return out
    has_prefix = kv_cache is not None
    if has_prefix:
        assert block_tables is not None and context_lens is not None, "a prefix needs its table"
        check_device(q, k, v, cu_seqlens_q, cu_seqlens_k, kv_cache, block_tables, context_lens)
        cache_strides, bt_stride = kv_cache.stride(), block_tables.stride(0)
        cache_block_size = kv_cache.shape[2]
    else:
        check_device(q, k, v, cu_seqlens_q, cu_seqlens_k)
        # Dummies: the prefix branch is compiled out, these are never dereferenced.
        kv_cache, block_tables, context_lens = q, cu_seqlens_q, cu_seqlens_q
        cache_strides, bt_stride, cache_block_size = (0,) * 5, 0, 1
    if sinks is not None:
        check_device(sinks)
        check_sinks(sinks, num_heads)
    if alibi is not None:
        check_device(alibi)
        check_alibi(alibi, num_heads)
    cfg = config or default_prefill_config(head_dim, q.dtype)
    grid = (triton.cdiv(max_seqlen_q, cfg.block_m), batch, num_heads)
    scale_log2, softcap_log2 = score_scales(scale, softcap)
    _prefill_kernel[grid](
        q,
        k,
        v,
        out,
        kv_cache,
        block_tables,
        context_lens,
        cu_seqlens_q,
        cu_seqlens_k,
        q if sinks is None else sinks,  # a dummy where SINKS is compiled out
        q if alibi is None else alibi,  # likewise where ALIBI is
        scale_log2,
        softcap_log2,
        chunk or window or 0,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *out.stride(),
        *cache_strides,
        bt_stride,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=head_block(head_dim),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        CACHE_BLOCK_SIZE=cache_block_size,
        HAS_PREFIX=has_prefix,
        SLIDING=window is not None,
        CHUNKED=chunk is not None,
        SOFTCAP=bool(softcap),
        SINKS=sinks is not None,
        ALIBI=alibi is not None,
        **dot_options(q.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
