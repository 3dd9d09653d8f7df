"""The native CPU paged decode kernel (shard/platforms/cpu/native/paged_decode.cpp) against float64
attention and against the torch backend's own SDPA path: every dtype, head sizes on and off its
AVX-512 path, MHA / GQA / MQA and a group too large for its registers, windows, soft-capped
scores (Gemma 2), one-row batches (split by KV head) and a cache whose unwritten slots are NaN;
and its K/V write (store_kv) against the torch path's."""

from __future__ import annotations

import pytest
import torch
from paged_helpers import NATIVE_REASON, NATIVE_TOL, PagedLayout, needs_native_kernel

from shard.platforms.cpu.attention import TorchAttentionBackend
from shard.platforms.cpu.native.build import paged_decode_kernel, store_kv_kernel

BLOCK = 16
TOL, REASON, needs_kernel = NATIVE_TOL, NATIVE_REASON, needs_native_kernel


def test_the_kernel_builds_wherever_its_toolchain_is_present():
    if REASON is not None:
        assert paged_decode_kernel() is None  # and the backend keeps its torch path
    else:
        assert paged_decode_kernel() is not None


def _case(batch, heads, kv_heads, dim, dtype, contexts, seed=0):
    """A NaN-poisoned paged cache holding each row's context, the metadata of one decode step,
    the queries, and each row's K/V in float64 for the reference."""
    gen = torch.Generator().manual_seed(seed)
    layout = PagedLayout(BLOCK, num_blocks=64, seed=seed)
    seqs = [layout.add(n + 3) for n in contexts]
    cache = torch.full((2, 64, BLOCK, kv_heads, dim), float("nan"), dtype=dtype)
    keys, values = [], []
    for s, n in zip(seqs, contexts, strict=True):
        k = torch.randn(n, kv_heads, dim, generator=gen).to(dtype)
        v = torch.randn(n, kv_heads, dim, generator=gen).to(dtype)
        for p in range(n):
            slot = layout.slot(s, p)
            cache[0].view(-1, kv_heads, dim)[slot] = k[p]
            cache[1].view(-1, kv_heads, dim)[slot] = v[p]
        keys.append(k.double())
        values.append(v.double())
    _, meta = layout.decode(seqs, [n - 1 for n in contexts])
    q = (torch.randn(batch, heads, dim, generator=gen) * 2).to(dtype)
    return cache, meta, q, keys, values


def _reference(q, keys, values, scale, window, softcap=None, sinks=None):
    out = []
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        if window is not None:
            k, v = k[-window:], v[-window:]
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("hd,khd->hk", q[i].double(), k) * scale
        if softcap is not None:  # Gemma 2: capped before the softmax
            scores = softcap * torch.tanh(scores / softcap)
        if sinks is None:
            probs = scores.softmax(-1)
        else:  # gpt-oss: each head's sink a last column of the softmax, dropped after it
            probs = torch.cat([scores, sinks.double()[:, None]], -1).softmax(-1)[:, :-1]
        out.append(torch.einsum("hk,khd->hd", probs, v))
    return torch.stack(out)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [(9, 3, 64), (4, 4, 128), (8, 1, 80), (6, 2, 72), (20, 1, 32)],
    ids=["gqa-64", "mha-128", "mqa-80", "gqa-72-scalar", "group20-32"],
)
@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("contexts", [[1, 17, 33, 70, 16, 2, 48], [37]], ids=["7rows", "1row"])
def test_kernel_equals_float64_attention(dtype, heads, kv_heads, dim, window, contexts):
    cache, meta, q, keys, values = _case(len(contexts), heads, kv_heads, dim, dtype, contexts)
    scale = dim**-0.5
    kernel = paged_decode_kernel()
    out = kernel(
        q, cache[0], cache[1], meta.block_tables, meta.context_lens, scale, window or 0, 0.0, None,
        None,
    )  # fmt: skip
    assert out.dtype == dtype and out.shape == q.shape
    want = _reference(q, keys, values, scale, window)
    tol = TOL[dtype]
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [(9, 3, 64), (4, 4, 128), (6, 2, 72)],
    ids=["gqa-64", "mha-128", "gqa-72-scalar"],
)
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("contexts", [[1, 17, 33, 70, 16, 2, 48], [37]], ids=["7rows", "1row"])
def test_kernel_soft_caps_as_float64_attention(dtype, heads, kv_heads, dim, window, contexts):
    """Gemma 2's softcap * tanh(s / softcap) of every scaled score, before the softmax. The
    scores (q at twice unit size, scale 0.5) run well past the cap, so a kernel that ignored
    it would miss by far more than the tolerance (checked)."""
    cache, meta, q, keys, values = _case(len(contexts), heads, kv_heads, dim, dtype, contexts)
    scale, softcap = 0.5, 3.0
    kernel = paged_decode_kernel()
    args = (q, cache[0], cache[1], meta.block_tables, meta.context_lens, scale, window or 0)
    out = kernel(*args, softcap, None, None)
    want = _reference(q, keys, values, scale, window, softcap)
    tol = TOL[dtype]
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)
    uncapped = _reference(q, keys, values, scale, window)
    multi = [i for i, n in enumerate(contexts) if min(n, window or n) > 1]  # one key: weight 1
    assert (want - uncapped)[multi].abs().max() > 20 * tol
    # 0: no cap, the plain scores as before.
    torch.testing.assert_close(
        kernel(*args, 0.0, None, None).double(), uncapped, atol=tol, rtol=tol
    )


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [(9, 3, 64), (4, 4, 128), (6, 2, 72)],
    ids=["gqa-64", "mha-128", "gqa-72-scalar"],
)
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_kernel_counts_sinks_as_float64_attention(dtype, heads, kv_heads, dim, window, softcap):
    """gpt-oss's attention sinks: each query head's own logit (here from -3 to 6, so some
    outweigh every score and some none) in its softmax's denominator; with a soft-cap too, the
    sink itself uncapped. A kernel that ignored them, or took a KV head's, misses by far more
    than the tolerance (checked)."""
    contexts = [1, 17, 33, 70, 2]
    cache, meta, q, keys, values = _case(len(contexts), heads, kv_heads, dim, dtype, contexts)
    sinks = torch.linspace(-3.0, 6.0, heads)
    scale = 0.5
    kernel = paged_decode_kernel()
    args = (q, cache[0], cache[1], meta.block_tables, meta.context_lens, scale, window or 0)
    out = kernel(*args, softcap, sinks, None)
    cap = softcap or None
    want = _reference(q, keys, values, scale, window, cap, sinks)
    tol = TOL[dtype]
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)
    assert (want - _reference(q, keys, values, scale, window, cap)).abs().max() > 20 * tol
    flipped = _reference(q, keys, values, scale, window, cap, sinks.flip(0))
    assert (want - flipped).abs().max() > 20 * tol
    with pytest.raises(RuntimeError, match=r"sinks must be float32 \[heads\]"):
        kernel(*args, softcap, sinks[1:], None)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_decode_runs_the_kernel_and_is_no_less_exact_than_its_torch_path(dtype):
    contexts = [3, 40, 129, 16, 77]
    cache, meta, q, keys, values = _case(5, 12, 4, 64, dtype, contexts, seed=4)
    backend, scale = TorchAttentionBackend(), 0.125
    q_strided = torch.cat([q, q], dim=2)[:, :, :64]  # the backend hands the kernel a copy
    native = backend.decode(q_strided, cache, meta, scale)
    kernel = paged_decode_kernel()
    direct = kernel(
        q, cache[0], cache[1], meta.block_tables, meta.context_lens, scale, 0, 0.0, None, None
    )
    assert torch.equal(native, direct)
    sdpa = TorchAttentionBackend(native=False).decode(q_strided, cache, meta, scale)
    want = _reference(q, keys, values, scale, None)
    native_err = (native.double() - want).abs().max()
    sdpa_err = (sdpa.double() - want).abs().max()
    # Within twice SDPA's own error: where the CPU lacks AVX-512 the kernel's scalar loop sums
    # a row's 129 weighted values in sequence, SDPA in blocks (fp32 on an AVX2 EPYC: 1.37e-6
    # against 8.5e-7, both a few ulps of outputs near 1; with AVX-512 the kernel was the closer).
    assert native_err <= 2 * sdpa_err + torch.finfo(dtype).eps, (native_err, sdpa_err)


@needs_kernel
def test_kernel_refuses_what_it_cannot_read():
    cache, meta, q, _, _ = _case(2, 4, 2, 16, torch.float32, [3, 5])
    kernel = paged_decode_kernel()

    def call(q=q, tables=meta.block_tables, lens=meta.context_lens, softcap=0.0):
        return kernel(q, cache[0], cache[1], tables, lens, 1.0, 0, softcap, None, None)

    with pytest.raises(RuntimeError, match="share a dtype"):
        call(q=q.bfloat16())
    with pytest.raises(RuntimeError, match="int32"):
        call(tables=meta.block_tables.long())
    with pytest.raises(RuntimeError, match="multiple of kv heads"):
        call(q=q[:, :3].contiguous())
    with pytest.raises(RuntimeError, match="block table's reach"):
        call(lens=meta.context_lens + 64)
    with pytest.raises(RuntimeError, match="not in the cache"):
        call(tables=meta.block_tables + 1000)
    with pytest.raises(RuntimeError, match="softcap must be 0 .none. or positive"):
        call(softcap=-1.0)


@needs_kernel
@pytest.mark.parametrize("batch", [1, 3])  # one row: split by KV head
@pytest.mark.parametrize("dim", [16, 64])  # off and on the register path
def test_q_may_be_a_view_into_the_fused_qkv_rows(batch, dim):
    cache, meta, q, _, _ = _case(batch, 4, 2, dim, torch.bfloat16, [5, 40, 17][:batch])
    kernel = paged_decode_kernel()
    fused = torch.randn(batch, 8, dim).bfloat16()  # [q heads | k heads | v heads] per row
    fused[:, :4] = q
    view = fused[:, :4]
    assert view.stride(0) == 8 * dim  # rows as far apart as the fused rows
    args = (cache[0], cache[1], meta.block_tables, meta.context_lens, 0.3, 0, 0.0, None, None)
    got = kernel(view, *args)
    assert got.is_contiguous() and torch.equal(got, kernel(q, *args))
    with pytest.raises(RuntimeError, match="heads contiguous"):
        kernel(q.transpose(1, 2).contiguous().transpose(1, 2), *args)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_store_kv_writes_what_the_torch_path_writes(dtype, slot_dtype):
    gen = torch.Generator().manual_seed(7)
    blocks, block_size, kv_heads, dim, tokens = 9, 16, 3, 64, 21
    cache = torch.randn(2, blocks, block_size, kv_heads, dim, generator=gen).to(dtype)
    # K and V as the model hands them: strided views of one fused projection, per token.
    fused = torch.randn(tokens, 4 * kv_heads * dim, generator=gen).to(dtype)
    key = fused[:, : kv_heads * dim].view(tokens, kv_heads, dim)
    value = fused[:, 2 * kv_heads * dim : 3 * kv_heads * dim].view(tokens, kv_heads, dim)
    slots = torch.randperm(blocks * block_size, generator=gen)[:tokens].to(slot_dtype)
    want = cache.clone()
    TorchAttentionBackend(native=False).store_kv(key, value, want, slots)
    got = cache.clone()
    TorchAttentionBackend().store_kv(key, value, got, slots)
    assert torch.equal(got, want)
    assert not torch.equal(got, cache)  # it did write


@needs_kernel
def test_store_kv_refuses_what_it_cannot_write():
    store = store_kv_kernel()
    cache = torch.zeros(2, 4, 16, 2, 8)
    key = value = torch.ones(3, 2, 8)
    with pytest.raises(RuntimeError, match="not in the cache"):
        store(key, value, cache, torch.tensor([0, 64, 1]))
    with pytest.raises(RuntimeError, match="not in the cache"):
        store(key, value, cache, torch.tensor([0, -1, 1]))
    with pytest.raises(RuntimeError, match="share a dtype"):
        store(key.bfloat16(), value.bfloat16(), cache, torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="one slot per token"):
        store(key, value, cache, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="heads and head size"):
        store(torch.ones(3, 4, 4), torch.ones(3, 4, 4), cache, torch.tensor([0, 1, 2]))
    assert not cache.any()  # nothing was written by a refused call
