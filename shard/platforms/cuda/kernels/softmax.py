"""The online-softmax step shared by the attention kernels (a device function, not a kernel).

Scores are kept in base 2: the softmax scale is pre-multiplied by log2(e) so every exponential
is an exp2, which maps to one hardware instruction.

Soft-capped scores (SOFTCAP, Gemma 2): the scaled score s = (q . k) * scale becomes
C * tanh(s / C) before the mask and the softmax. tl has no tanh, and libdevice's fails in the
interpreter (triton 3.5), so it is written with one exp2: tanh(|x|) = (1 - e) / (1 + e) with
e = 2^(-2 |x| log2(e)) in (0, 1], which never overflows; `score_scales` folds the constants.

ALiBi (BIASED, BLOOM, MPT): the caller's bias tile, slope * (key position - query position) in
base 2 (`alibi_bias`), is added to the capped scores before the mask.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


def score_scales(scale: float, softcap: float | None) -> tuple[float, float]:
    """The two score constants the attention kernels take: (scale_log2, softcap_log2).

    Without a cap: scale * log2(e), which turns q . k into a base-2 score, and 0 (unused).
    With cap C: 2 * scale * log2(e) / C, which turns q . k into tanh's exponent 2 (s / C) in
    base 2, and C * log2(e), which turns tanh(s / C) into the capped score in base 2."""
    if not softcap:
        return scale * math.log2(math.e), 0.0
    return 2 * scale * math.log2(math.e) / softcap, softcap * math.log2(math.e)


def check_alibi(alibi: torch.Tensor, num_heads: int) -> None:
    """The kernels read head h's slope at alibi_ptr + h, as they read sinks: the same
    contract, checked the same way (metadata only)."""
    contiguous = alibi.ndim == 1 and (num_heads == 1 or alibi.stride(0) == 1)
    if alibi.shape != (num_heads,) or not contiguous or alibi.dtype != torch.float32:
        raise ValueError(
            f"alibi must be one contiguous float32 slope per query head ({num_heads}), got "
            f"shape {tuple(alibi.shape)}, stride {alibi.stride()}, {alibi.dtype}"
        )


@triton.jit
def alibi_bias(slope, key_pos, query_pos):
    """ALiBi's bias in base 2 (log2(e)): slope * (key_pos - query_pos), the three broadcast to
    the score tile ([M, 1] or scalar slopes and query positions, [1, N] key positions)."""
    return slope * 1.4426950408889634 * (key_pos - query_pos).to(tl.float32)


def check_sinks(sinks: torch.Tensor, num_heads: int) -> None:
    """The kernels read head h's sink at sinks_ptr + h: any other shape or stride would read
    other heads' sinks, or past the end, without a word. float32 is the contract (the variants
    compiled ahead in tests/kernels/gpu_compile.py are fp32's). Only metadata is read, never the
    values, so the check is free and safe inside a CUDA graph capture."""
    contiguous = sinks.ndim == 1 and (num_heads == 1 or sinks.stride(0) == 1)
    if sinks.shape != (num_heads,) or not contiguous or sinks.dtype != torch.float32:
        raise ValueError(
            f"sinks must be one contiguous float32 logit per query head ({num_heads}), got "
            f"shape {tuple(sinks.shape)}, stride {sinks.stride()}, {sinks.dtype}"
        )


@triton.jit
def attend_tile(
    q,
    k,
    v,
    m_i,
    l_i,
    acc,
    mask,
    scale_log2,
    softcap_log2,
    MASKED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    bias=None,
    BIASED: tl.constexpr = False,
):
    """Folds one key/value tile into the running (max, sum, weighted values) of each query row.

    q [M, D], k/v [N, D], mask [M, N] (ignored unless MASKED). In a masked tile a row may see no
    key at all, and may have seen none before either (a sliding window starts after the tile);
    its max is then still -inf, and the exponentials are taken against 0 instead, so they come
    out as clean zeros rather than exp2(-inf - -inf) = NaN. An unmasked tile never needs this.

    `scale_log2` and `softcap_log2` are `score_scales`' (SOFTCAP: the cap is applied to every
    score before the mask, as Gemma 2 orders them; off, the scores are exactly as without it).
    BIASED: `bias` [M, N] (ALiBi's, base 2) is added to the capped scores before the mask.
    """
    dtype = q.dtype
    k = k.to(dtype)
    v = v.to(dtype)
    if DOT_UPCAST:  # interpreter only, see shard.platforms.cuda.kernels.dot_options
        q = q.to(tl.float32)
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    if SOFTCAP:  # s is 2 (score / C) in base 2 here: C tanh(score / C), in base 2
        e = tl.exp2(-tl.abs(s))
        t = (1.0 - e) / (1.0 + e)
        s = tl.where(s < 0, -t, t) * softcap_log2
    if BIASED:
        s = s + bias
    if MASKED:
        s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = m_new
    if MASKED:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    # P is rounded to the value dtype for the second matmul, as flash-attention does: with 16-bit
    # inputs the tensor cores want both operands in 16 bits; the accumulator stays fp32.
    p = p.to(dtype)
    if DOT_UPCAST:
        p = p.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc
