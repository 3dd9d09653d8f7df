"""ALiBi (BLOOM, MPT) in the torch backend: its explicit-scores prefill (cached prefixes,
windows) and decode, and the native CPU paged decode kernel (AVX-512 register path, scalar
path), against float64 attention written out here: scaled scores plus slope[h] * (key position
- query position), the causal / window mask, the softmax. The slopes differ within each KV
head's group, and the bias moves every case far past its tolerance (checked), so a path that
drops the term, or reads a slope per KV head, fails."""

from __future__ import annotations

import pytest
import torch
from paged_helpers import NATIVE_TOL, PagedLayout, needs_native_kernel

from shard.layers.alibi import bloom_slopes
from shard.platforms.cpu.attention import TorchAttentionBackend
from shard.platforms.cpu.native.build import paged_decode_kernel

BLOCK = 16
TOL = {torch.float32: 2e-5, torch.bfloat16: NATIVE_TOL[torch.bfloat16]}


def _reference(q, k, v, q_pos, scale, slopes, window=None):
    """One sequence in float64: q [Lq, H, D] at positions q_pos over k, v [Lk, Hkv, D] at
    positions 0 .. Lk - 1 -> [Lq, H, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    k_pos = torch.arange(k.shape[0])
    if slopes is not None:
        scores = scores + slopes.double()[:, None, None] * (k_pos[None, :] - q_pos[:, None])
    seen = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        seen &= k_pos[None, :] > q_pos[:, None] - window
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~seen, -torch.inf).softmax(-1), v)


class _Case:
    """Sequences of `totals` tokens in a NaN-poisoned paged cache, the last `new` of each this
    step's (their K/V also passed apart, as a prefill hands them over)."""

    def __init__(self, heads, kv_heads, dim, dtype, totals, new, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.layout = PagedLayout(BLOCK, num_blocks=64, seed=seed)
        self.seqs = [self.layout.add(n + 3) for n in totals]
        self.totals, self.new = totals, new
        self.cache = torch.full((2, 64, BLOCK, kv_heads, dim), float("nan"), dtype=dtype)
        self.keys = [torch.randn(n, kv_heads, dim, generator=gen).to(dtype) for n in totals]
        self.values = [torch.randn(n, kv_heads, dim, generator=gen).to(dtype) for n in totals]
        for s, k, v in zip(self.seqs, self.keys, self.values, strict=True):
            for p in range(len(k)):
                slot = self.layout.slot(s, p)
                self.cache[0].view(-1, kv_heads, dim)[slot] = k[p]
                self.cache[1].view(-1, kv_heads, dim)[slot] = v[p]
        self.q = torch.randn(sum(new), heads, dim, generator=gen).to(dtype)

    def expected(self, scale, slopes, window=None):
        parts, start = [], 0
        for k, v, n, t in zip(self.keys, self.values, self.new, self.totals, strict=True):
            q = self.q[start : start + n]
            parts.append(_reference(q, k, v, torch.arange(t - n, t), scale, slopes, window))
            start += n
        return torch.cat(parts)

    def check(self, out, scale, slopes, window=None):
        want = self.expected(scale, slopes, window)
        tol = TOL[out.dtype]
        torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)
        assert (want - self.expected(scale, None, window)).abs().max() > 20 * tol


# 6 heads: BLOOM's slopes for a head count that is not a power of two; the group's heads differ
SLOPES = torch.tensor(bloom_slopes(6)).roll(2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 9])
def test_prefill_with_cached_prefix(dtype, window):
    """One sequence fresh, one after a cached prefix ending mid-block, one past several blocks."""
    case = _Case(6, 2, 32, dtype, totals=[23, 30, 52], new=[23, 11, 17], seed=1)
    starts = [t - n for t, n in zip(case.totals, case.new, strict=True)]
    _, meta = case.layout.prefill(case.seqs, starts, case.totals)
    k = torch.cat([k[s:] for k, s in zip(case.keys, starts, strict=True)])
    v = torch.cat([v[s:] for v, s in zip(case.values, starts, strict=True)])
    scale = 32**-0.5
    for backend in (TorchAttentionBackend(), TorchAttentionBackend(native=False)):
        out = backend.prefill(case.q, k, v, case.cache, meta, scale, window, alibi=SLOPES)
        case.check(out, scale, SLOPES, window)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
def test_torch_decode(dtype, window):
    case = _Case(6, 2, 32, dtype, totals=[1, 17, 40], new=[1, 1, 1], seed=2)
    _, meta = case.layout.decode(case.seqs, [t - 1 for t in case.totals])
    out = TorchAttentionBackend(native=False).decode(
        case.q, case.cache, meta, 0.25, window, alibi=SLOPES
    )
    case.check(out, 0.25, SLOPES, window)


@needs_native_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [64, 72])  # the AVX-512 register path, the scalar loop
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("totals", [[1, 17, 33, 70], [37]], ids=["4rows", "1row"])
def test_native_decode_kernel(dtype, dim, window, totals):
    """Directly and through the backend (which takes the kernel); one row is split by KV head."""
    case = _Case(6, 2, dim, dtype, totals=totals, new=[1] * len(totals), seed=3)
    _, meta = case.layout.decode(case.seqs, [t - 1 for t in totals])
    scale = dim**-0.5
    kernel = paged_decode_kernel()
    out = kernel(
        case.q, case.cache[0], case.cache[1], meta.block_tables, meta.context_lens, scale,
        window or 0, 0.0, None, SLOPES,
    )  # fmt: skip
    case.check(out, scale, SLOPES, window)
    backend = TorchAttentionBackend().decode(case.q, case.cache, meta, scale, window, alibi=SLOPES)
    assert torch.equal(backend, out)


@needs_native_kernel
def test_native_kernel_refuses_slopes_per_kv_head():
    case = _Case(6, 2, 32, torch.float32, totals=[5], new=[1])
    _, meta = case.layout.decode(case.seqs, [4])
    with pytest.raises(RuntimeError, match=r"alibi must be float32 \[heads\] slopes"):
        paged_decode_kernel()(
            case.q, case.cache[0], case.cache[1], meta.block_tables, meta.context_lens, 1.0, 0,
            0.0, None, SLOPES[:2],
        )  # fmt: skip
