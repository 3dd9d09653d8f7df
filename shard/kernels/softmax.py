"""The online-softmax step shared by the attention kernels (a device function, not a kernel).

Scores are kept in base 2: the softmax scale is pre-multiplied by log2(e) so every exponential
is an exp2, which maps to one hardware instruction.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """Folds one key/value tile into the running (max, sum, weighted values) of each query row.

    q [M, D], k/v [N, D], mask [M, N] (ignored unless MASKED). In a masked tile a row may see no
    key at all, and may have seen none before either (a sliding window starts after the tile);
    its max is then still -inf, and the exponentials are taken against 0 instead, so they come
    out as clean zeros rather than exp2(-inf - -inf) = NaN. An unmasked tile never needs this.
    """
    dtype = q.dtype
    k = k.to(dtype)
    v = v.to(dtype)
    if DOT_UPCAST:  # interpreter only, see shard.kernels.dot_options
        q = q.to(tl.float32)
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
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
