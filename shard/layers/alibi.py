"""ALiBi's per-head slopes (attention with linear biases: BLOOM, MPT). Head h adds
slope[h] * (key position - query position) to each of its scaled scores before the softmax
(shard/attention/backend.py's `alibi`); the families differ only in how the slopes are drawn,
so each formula here is the one its transformers model computes, in float32 as it does."""

from __future__ import annotations

import math

import torch


def bloom_slopes(num_heads: int) -> tuple[float, ...]:
    """BLOOM's: for the largest power of two p <= heads, 2^(-8/p) to the powers 1 .. p; the
    heads past p take 2^(-4/p) to the odd powers 1, 3, 5, ... (the in-between slopes of 2p
    heads), as transformers' `_get_alibi_slopes`."""
    p = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(p) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + p, dtype=torch.int32))
    if p != num_heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * p) - 3))), dtype=torch.float32)
        extra = min(p, num_heads - p)
        powers = torch.arange(1, 1 + 2 * extra, 2, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra_base, powers)])
    return tuple(slopes.tolist())


def mpt_slopes(num_heads: int, alibi_bias_max: float = 8.0) -> tuple[float, ...]:
    """MPT's: for p the power of two >= heads, 1 / 2^(i * bias_max / p), i = 1 .. p; with fewer
    heads than p, the even-indexed ones then the odd ones, the first `heads` of them (as
    transformers' `build_mpt_alibi_tensor`). Equal to BLOOM's at alibi_bias_max 8."""
    p = 2 ** math.ceil(math.log2(num_heads))
    base = torch.arange(1, p + 1, dtype=torch.int64).float() * (alibi_bias_max / p)
    slopes = 1.0 / torch.pow(2, base)
    if p != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return tuple(slopes.tolist())
