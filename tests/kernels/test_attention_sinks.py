"""gpt-oss's attention sinks in the Triton prefill and decode kernels and the Triton backend,
against a float64 reference written out here, independent of every kernel and backend: the
scores, their mask, the sink as one more column, the softmax, the column dropped (as
transformers' eager_attention_forward for gpt-oss). The paged cache is filled here too."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kernel_cases import DEVICE, TOLERANCES, PagedBatch, randn

from shard.platforms.cuda.attention import TritonAttentionBackend
from shard.platforms.cuda.kernels.decode import paged_decode
from shard.platforms.cuda.kernels.prefill import varlen_prefill

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
# One logit per query head, different within each KV head's group, so a kernel reading
# sinks[h // group] fails: +8 outweighs all of its head's scores (its outputs shrink ~100x), -8
# vanishes beside them, the two others are in between.
SINKS = torch.tensor([8.0, 1.5, -8.0, -0.5])


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One sequence in float64: q [Lq, H, D] at positions q_pos over its keys and values
    k, v [Lk, Hkv, D] at positions 0 .. Lk - 1 -> [Lq, H, D]."""
    group = q.shape[1] // k.shape[1]
    q, k, v = (
        q.double(),
        k.double().repeat_interleave(group, 1),
        v.double().repeat_interleave(group, 1),
    )
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    k_pos = torch.arange(k.shape[0])
    seen = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        seen &= k_pos[None, :] > q_pos[:, None] - window
    scores = scores.masked_fill(~seen, float("-inf"))
    if sinks is not None:  # the raw logit: neither scaled nor capped
        column = sinks.double()[:, None, None].expand(-1, scores.shape[1], 1)
        scores = torch.cat([scores, column], dim=-1)
    probs = scores.softmax(dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    return torch.einsum("hqk,khd->qhd", probs, v)


class Case:
    """Sequences of prefixes[i] cached tokens then new_lens[i] new ones (decode: 1), their keys
    and values written straight into a paged cache whose block tables are non-contiguous."""

    def __init__(self, prefixes: list[int], new_lens: list[int], dtype: torch.dtype, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.prefixes, self.totals = (
            prefixes,
            [p + n for p, n in zip(prefixes, new_lens, strict=True)],
        )
        # Room beyond each sequence, as the router reserves it: the block table is wider.
        self.batch = PagedBatch.allocate([n + 9 for n in self.totals], 16, seed=seed)
        self.cache = self.batch.empty_cache(KV_HEADS, HEAD_DIM, dtype)
        self.keys = [randn(n, KV_HEADS, HEAD_DIM, dtype=dtype, gen=gen) for n in self.totals]
        self.values = [randn(n, KV_HEADS, HEAD_DIM, dtype=dtype, gen=gen) for n in self.totals]
        k_slots, v_slots = (c.view(-1, KV_HEADS, HEAD_DIM) for c in self.cache)
        for i, n in enumerate(self.totals):
            slots = torch.tensor(self.batch.slots(i, 0, n), device=DEVICE)
            k_slots[slots], v_slots[slots] = self.keys[i], self.values[i]
        # A view of a fused projection, as the model hands q over: not a [T, H, D] tensor's
        # strides.
        q = randn(sum(new_lens), HEADS + 2 * KV_HEADS, HEAD_DIM, dtype=dtype, gen=gen)
        self.q = q[:, :HEADS]

    def packed_new(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t[p:] for t, p in zip(tensors, self.prefixes, strict=True)])

    def expected(self, scale: float, **options) -> torch.Tensor:
        parts, start = [], 0
        for i, (p, n) in enumerate(zip(self.prefixes, self.totals, strict=True)):
            q = self.q[start : start + n - p].cpu()
            keys, values = self.keys[i].cpu(), self.values[i].cpu()
            parts.append(reference(q, keys, values, torch.arange(p, n), scale, **options))
            start += n - p
        return torch.cat(parts)


def check(out: torch.Tensor, expected: torch.Tensor, sinkless: torch.Tensor | None) -> None:
    """out against the reference, absolutely and, per head, relative to that head's largest
    output (the +8 head's outputs are so small that the absolute check alone would pass zeros
    for them); and the sinks moved the output by far more than the tolerance."""
    tol = TOLERANCES[out.dtype]
    got = out.double().cpu()
    torch.testing.assert_close(got, expected, **tol)
    size = expected.abs().amax(dim=(0, 2), keepdim=True)
    torch.testing.assert_close(got / size, expected / size, **tol)
    if sinkless is not None:
        assert (expected - sinkless).abs().max() > 10 * tol["atol"]


def prefill(case: Case, scale: float, *, prefix: bool, **options) -> torch.Tensor:
    meta = case.batch.prefill_meta(case.prefixes, case.totals)
    cache = dict(
        kv_cache=case.cache, block_tables=meta.block_tables, context_lens=meta.context_lens
    )
    k, v = case.packed_new(case.keys), case.packed_new(case.values)
    return varlen_prefill(
        case.q, k, v, meta.cu_seqlens_q, meta.cu_seqlens_q, meta.max_seqlen_q, scale,
        **(cache if prefix else {}), **options,
    )  # fmt: skip


def decode(case: Case, scale: float, **options) -> torch.Tensor:
    meta = case.batch.decode_meta(case.totals)
    return paged_decode(case.q, case.cache, meta.block_tables, meta.context_lens, scale, **options)


@pytest.mark.parametrize(
    ("dtype", "prefix", "window"),
    [(torch.float32, False, None), (torch.float16, True, None), (torch.bfloat16, True, 9),
     (torch.float32, True, 9), (torch.bfloat16, False, 9)],
)  # fmt: skip
def test_prefill(dtype, prefix, window):
    """Packed sequences of uneven lengths, off the 16-token tiles; with a cached prefix, one
    sequence has none, one's ends mid-block and one's spans blocks (and the window reaches back
    into some of them)."""
    prefixes = [0, 7, 20] if prefix else [0, 0, 0]
    case = Case(prefixes, [5, 21, 18], dtype, seed=1)
    scale = HEAD_DIM**-0.5
    out = prefill(case, scale, prefix=prefix, window=window, sinks=SINKS.to(DEVICE))
    assert out.dtype == dtype and out.shape == case.q.shape
    expected = case.expected(scale, window=window, sinks=SINKS)
    check(out, expected, case.expected(scale, window=window))


@pytest.mark.parametrize(("dtype", "window"), [(torch.float32, None), (torch.bfloat16, 9)])
def test_prefill_soft_capped(dtype, window):
    """A scale of 1 puts the scores (head dim 32) well past the cap of 3; the sink is not capped
    (+8 would be cut to under 3)."""
    case = Case([0, 11], [19, 6], dtype, seed=2)
    scale, softcap = 1.0, 3.0
    sinks = SINKS.to(DEVICE)
    out = prefill(case, scale, prefix=True, window=window, softcap=softcap, sinks=sinks)
    expected = case.expected(scale, window=window, softcap=softcap, sinks=SINKS)
    check(out, expected, case.expected(scale, window=window, softcap=softcap))
    uncapped = case.expected(scale, window=window, sinks=SINKS)
    assert (expected - uncapped).abs().max() > 10 * TOLERANCES[dtype]["atol"]


@pytest.mark.parametrize(
    ("dtype", "window", "num_splits", "split_per_sequence"),
    [(torch.float32, None, 1, False), (torch.float16, 7, 1, False),
     (torch.bfloat16, None, 3, True), (torch.float32, 7, 3, True),
     (torch.float16, None, 3, False)],
)  # fmt: skip
def test_decode(dtype, window, num_splits, split_per_sequence):
    """Uneven contexts, from 1 token (whose extra splits hold nothing) to several tiles. Split,
    the sink is counted once, in the reduce; per sequence is how CUDA graphs split."""
    case = Case([0, 4, 16, 39], [1] * 4, dtype, seed=3)
    scale = HEAD_DIM**-0.5
    out = decode(
        case, scale, window=window, sinks=SINKS.to(DEVICE),
        num_splits=num_splits, split_per_sequence=split_per_sequence,
    )  # fmt: skip
    assert out.dtype == dtype and out.shape == case.q.shape
    expected = case.expected(scale, window=window, sinks=SINKS)
    check(out, expected, case.expected(scale, window=window))


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_soft_capped(num_splits):
    case = Case([2, 40], [1, 1], torch.float32, seed=4)
    scale, softcap = 1.0, 3.0
    out = decode(case, scale, softcap=softcap, sinks=SINKS.to(DEVICE), num_splits=num_splits)
    expected = case.expected(scale, softcap=softcap, sinks=SINKS)
    check(out, expected, case.expected(scale, softcap=softcap))


def test_without_sinks_and_with_negligible_ones():
    """sinks=None is the kernels without sinks, equal to the sinkless reference; a sink of
    -10^4 weighs exp2(-1.4e4) = 0 in fp32, so the kernels with the SINKS branch compiled in give
    the very same bits: the branch adds to the denominator and nothing else. (Not -inf: a
    padding row of a windowed prefill block that sees no key has a max of -inf, and
    -inf - -inf is a NaN, harmless there since the row is never stored, but a warning.)"""
    scale, window = HEAD_DIM**-0.5, 9
    negligible = torch.full((HEADS,), -1e4, device=DEVICE)
    case = Case([0, 7], [21, 5], torch.bfloat16, seed=5)
    out = prefill(case, scale, prefix=True, window=window)
    check(out, case.expected(scale, window=window), None)
    same = prefill(case, scale, prefix=True, window=window, sinks=negligible)
    torch.testing.assert_close(same, out, rtol=0, atol=0)
    case = Case([0, 4, 39], [1] * 3, torch.float32, seed=6)
    for num_splits in (1, 3):
        split = dict(num_splits=num_splits, split_per_sequence=True)
        out = decode(case, scale, **split)
        check(out, case.expected(scale), None)
        torch.testing.assert_close(
            decode(case, scale, sinks=negligible, **split), out, rtol=0, atol=0
        )


def test_backend_passes_sinks_through():
    """TritonAttentionBackend: prefill after a cached prefix, then decode as a CUDA graph
    captures it (meta.captured: splits cut per sequence on the device)."""
    backend, scale, window = TritonAttentionBackend(), HEAD_DIM**-0.5, 9
    sinks = SINKS.to(DEVICE)
    case = Case([0, 18], [23, 12], torch.float32, seed=7)
    meta = case.batch.prefill_meta(case.prefixes, case.totals)
    k, v = case.packed_new(case.keys), case.packed_new(case.values)
    out = backend.prefill(case.q, k, v, case.cache, meta, scale, window, None, sinks)
    check(
        out, case.expected(scale, window=window, sinks=SINKS), case.expected(scale, window=window)
    )

    case = Case([0, 9, 33], [1] * 3, torch.float32, seed=8)
    meta = replace(case.batch.decode_meta(case.totals), captured=True)
    out = backend.decode(case.q, case.cache, meta, scale, None, None, sinks)
    check(out, case.expected(scale, sinks=SINKS), case.expected(scale))


BAD_SINKS = {
    "per-kv-head": lambda s: s[:KV_HEADS],
    "float64": lambda s: s.double(),
    "strided": lambda s: torch.stack([s, s], 1)[:, 0],
}


@pytest.mark.parametrize("bad", BAD_SINKS)
def test_refuses_sinks_the_kernels_would_misread(bad):
    sinks = BAD_SINKS[bad](SINKS.to(DEVICE))
    case = Case([0], [1], torch.float32, seed=9)
    with pytest.raises(ValueError, match="one contiguous float32 logit per query head"):
        decode(case, 1.0, sinks=sinks)
    with pytest.raises(ValueError, match="one contiguous float32 logit per query head"):
        prefill(case, 1.0, prefix=False, sinks=sinks)
