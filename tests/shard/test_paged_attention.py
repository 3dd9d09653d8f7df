"""The torch attention backend against naive dense attention, one sequence at a time."""

from __future__ import annotations

import pytest
import torch
from paged_helpers import PagedLayout

from shard.attention import get_attention_backend
from shard.platforms.cpu.attention import TorchAttentionBackend

D = 8
BLOCK = 16


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    window: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """q [Lq, H, D] at the last Lq of the Lk positions of k/v [Lk, Hkv, D]; float64, causal;
    with a window, query i sees key j only when i - window < j (transformers' sliding mask);
    with chunks, only when i // chunk == j // chunk (its chunked mask)."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    lq, lk = q.shape[0], k.shape[0]
    q_pos = torch.arange(lk - lq, lk)[:, None]
    k_pos = torch.arange(lk)[None, :]
    causal = k_pos <= q_pos
    if window is not None:
        causal &= k_pos > q_pos - window
    if chunk is not None:
        causal &= k_pos // chunk == q_pos // chunk
    probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v).float()


def make_cache(num_blocks: int, num_kv_heads: int, poison: bool = True) -> torch.Tensor:
    # NaN in every slot nobody wrote: reading one through a bad index or mask shows up at once.
    fill = float("nan") if poison else 0.0
    return torch.full((2, num_blocks, BLOCK, num_kv_heads, D), fill)


@pytest.fixture
def backend():
    return get_attention_backend("torch")


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_prefill_ragged_packed(backend, heads, kv_heads):
    torch.manual_seed(0)
    lens = [5, 16, 21, 37]
    layout = PagedLayout(BLOCK, num_blocks=12, seed=1)
    seqs = [layout.add(n) for n in lens]
    _, meta = layout.prefill(seqs, [0] * len(lens), lens)
    total = sum(lens)
    q, k, v = (
        torch.randn(total, heads, D),
        torch.randn(total, kv_heads, D),
        torch.randn(total, kv_heads, D),
    )
    cache = make_cache(12, kv_heads)
    backend.store_kv(k, v, cache, meta.slot_mapping)
    out = backend.prefill(q, k, v, cache, meta, scale=D**-0.5)
    cu = meta.cu_seqlens_q.tolist()
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        expected = naive_attention(q[a:b], k[a:b], v[a:b], D**-0.5)
        torch.testing.assert_close(out[a:b], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 1, 5, 16, 24])
def test_prefill_with_cached_prefix(backend, window):
    prefill_with_cached_prefix(backend, window=window)


# chunks shorter than a block and not dividing it, a block, and longer than every sequence
# (within one chunk the native kernel takes the sequence, else the masked path)
@pytest.mark.parametrize("chunk", [3, 7, 16, 20, 64])
@pytest.mark.parametrize("native", [True, False])
def test_prefill_in_attention_chunks(chunk, native):
    prefill_with_cached_prefix(TorchAttentionBackend(native=native), chunk=chunk)


def prefill_with_cached_prefix(backend, *, window=None, chunk=None):
    torch.manual_seed(1)
    heads, kv_heads = 4, 2
    prefixes, totals = [16, 7, 0, 30], [21, 27, 9, 31]
    layout = PagedLayout(BLOCK, num_blocks=12, seed=2)
    seqs = [layout.add(n) for n in totals]
    full_k = [torch.randn(n, kv_heads, D) for n in totals]
    full_v = [torch.randn(n, kv_heads, D) for n in totals]
    cache = make_cache(12, kv_heads)
    # An earlier step cached the prefixes.
    cached = [i for i, p in enumerate(prefixes) if p > 0]
    _, earlier = layout.prefill(cached, [0] * len(cached), [prefixes[i] for i in cached])
    backend.store_kv(
        torch.cat([full_k[i][: prefixes[i]] for i in cached]),
        torch.cat([full_v[i][: prefixes[i]] for i in cached]),
        cache,
        earlier.slot_mapping,
    )
    _, meta = layout.prefill(seqs, prefixes, totals)
    k = torch.cat([kk[p:] for kk, p in zip(full_k, prefixes, strict=True)])
    v = torch.cat([vv[p:] for vv, p in zip(full_v, prefixes, strict=True)])
    q = torch.randn(k.shape[0], heads, D)
    backend.store_kv(k, v, cache, meta.slot_mapping)
    out = backend.prefill(q, k, v, cache, meta, scale=0.3, window=window, chunk=chunk)
    cu = meta.cu_seqlens_q.tolist()
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        expected = naive_attention(q[a:b], full_k[i], full_v[i], 0.3, window, chunk)
        torch.testing.assert_close(out[a:b], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "heads,kv_heads,window",
    [(4, 4, None), (4, 2, None), (6, 1, None), (4, 2, 1), (4, 2, 7), (6, 1, 16)],
)
def test_decode_matches_naive(backend, heads, kv_heads, window):
    decode_matches_naive(backend, heads, kv_heads, window=window)


@pytest.mark.parametrize("chunk", [1, 5, 16, 17, 40])
@pytest.mark.parametrize("native", [True, False])
def test_decode_in_attention_chunks(chunk, native):
    # contexts ending at a chunk's first and last positions, and inside one
    decode_matches_naive(TorchAttentionBackend(native=native), 4, 2, chunk=chunk)


def decode_matches_naive(backend, heads, kv_heads, *, window=None, chunk=None):
    torch.manual_seed(2)
    contexts = [1, 17, 33, 40, 16]
    layout = PagedLayout(BLOCK, num_blocks=16, seed=3)
    seqs = [layout.add(n + 5) for n in contexts]  # reserved beyond the context, as the router does
    full_k = [torch.randn(n, kv_heads, D) for n in contexts]
    full_v = [torch.randn(n, kv_heads, D) for n in contexts]
    cache = make_cache(16, kv_heads)
    _, before = layout.prefill(seqs, [0] * len(seqs), [n - 1 for n in contexts])
    backend.store_kv(
        torch.cat([kk[:-1] for kk in full_k]),
        torch.cat([vv[:-1] for vv in full_v]),
        cache,
        before.slot_mapping,
    )
    _, meta = layout.decode(seqs, [n - 1 for n in contexts])
    q = torch.randn(len(contexts), heads, D)
    backend.store_kv(
        torch.stack([kk[-1] for kk in full_k]),
        torch.stack([vv[-1] for vv in full_v]),
        cache,
        meta.slot_mapping,
    )
    out = backend.decode(q, cache, meta, scale=D**-0.5, window=window, chunk=chunk)
    assert out.shape == (len(contexts), heads, D)
    for i in range(len(contexts)):
        expected = naive_attention(q[i : i + 1], full_k[i], full_v[i], D**-0.5, window, chunk)
        expected = expected[0]
        torch.testing.assert_close(out[i], expected, atol=1e-5, rtol=1e-5)


def test_store_kv_writes_each_token_at_its_slot(backend):
    cache = make_cache(4, 2, poison=False)
    key, value = torch.randn(3, 2, D), torch.randn(3, 2, D)
    slots = torch.tensor([5, 63, 16])  # block 0 offset 5, block 3 offset 15, block 1 offset 0
    backend.store_kv(key, value, cache, slots)
    for t, (block, offset) in enumerate([(0, 5), (3, 15), (1, 0)]):
        assert torch.equal(cache[0, block, offset], key[t])
        assert torch.equal(cache[1, block, offset], value[t])
    assert int((cache != 0).any(-1).any(-1).sum()) == 6


def test_unknown_backends_fail_clearly():
    with pytest.raises(ValueError, match="'flash9'.*torch"):
        get_attention_backend("flash9")
