"""The native CPU paged prefill kernels (shard/platforms/cpu/native/paged_prefill.cpp, and its bf16
form on the AMX tile unit, paged_prefill_amx.cpp) against float64 causal attention and against the
torch backend's SDPA path: every dtype, head sizes on and off a multiple of 16 (and of the tile
unit's 32), MHA / GQA / MQA and groups wider than a head tile, fresh prompts and chunks that
continue a cached prefix, windows, soft-capped scores (Gemma 2), odd token counts (a tile of one
token), a subset of the step's sequences (the others' rows untouched), q as a view into fused rows,
a NaN-poisoned cache (no position outside a sequence's reach is read), and their refusals."""

from __future__ import annotations

import pytest
import torch
from paged_helpers import NATIVE_REASON, NATIVE_TOL, PagedLayout, needs_native_kernel

from shard.platforms.cpu import attention as torch_backend
from shard.platforms.cpu.attention import TorchAttentionBackend
from shard.platforms.cpu.native.build import amx_paged_prefill_kernel, paged_prefill_kernel

BLOCK = 16
TOL, REASON, needs_kernel = NATIVE_TOL, NATIVE_REASON, needs_native_kernel
needs_amx = pytest.mark.skipif(
    amx_paged_prefill_kernel() is None,
    reason="no AMX-BF16 tile unit lent to this process (CPU, OS or build), or SWITCHYARD_CPU_AMX=0",
)
# Each kernel with the dtypes it takes.
KERNELS = {
    "vector": (paged_prefill_kernel, [torch.float32, torch.bfloat16, torch.float16]),
    "amx": (amx_paged_prefill_kernel, [torch.bfloat16]),
}
KERNEL_CASES = [
    pytest.param(name, dtype, marks=needs_kernel if name == "vector" else needs_amx)
    for name, (_, dtypes) in KERNELS.items()
    for dtype in dtypes
]


def test_the_kernel_builds_wherever_its_toolchain_is_present():
    assert (paged_prefill_kernel() is None) == (REASON is not None)


def _case(heads, kv_heads, dim, dtype, chunks, seed=0):
    """chunks: (cached prefix, new tokens) per sequence. A NaN-poisoned paged cache holding every
    sequence's positions up to the end of its chunk (as store_kv leaves it before attention),
    the step's metadata, q [T, H, D] and each sequence's K/V in float64."""
    gen = torch.Generator().manual_seed(seed)
    blocks = sum(-(-(p + n) // BLOCK) for p, n in chunks) + 4
    layout = PagedLayout(BLOCK, num_blocks=blocks, seed=seed)
    seqs = [layout.add(p + n) for p, n in chunks]
    cache = torch.full((2, blocks, BLOCK, kv_heads, dim), float("nan"), dtype=dtype)
    keys, values = [], []
    for s, (prefix, new) in zip(seqs, chunks, strict=True):
        k = torch.randn(prefix + new, kv_heads, dim, generator=gen).to(dtype)
        v = torch.randn(prefix + new, kv_heads, dim, generator=gen).to(dtype)
        for p in range(prefix + new):
            cache[0].view(-1, kv_heads, dim)[layout.slot(s, p)] = k[p]
            cache[1].view(-1, kv_heads, dim)[layout.slot(s, p)] = v[p]
        keys.append(k.double())
        values.append(v.double())
    _, meta = layout.prefill(seqs, [p for p, _ in chunks], [p + n for p, n in chunks])
    tokens = sum(n for _, n in chunks)
    q = (torch.randn(tokens, heads, dim, generator=gen) * 2).to(dtype)
    return cache, meta, q, keys, values


def _reference(q, chunks, keys, values, scale, window, softcap=None):
    out, start = [], 0
    for (prefix, new), k, v in zip(chunks, keys, values, strict=True):
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("thd,khd->htk", q[start : start + new].double(), k) * scale
        if softcap is not None:  # Gemma 2: capped before the mask and the softmax
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = torch.arange(prefix, prefix + new)[:, None]
        k_pos = torch.arange(prefix + new)[None, :]
        seen = k_pos <= q_pos
        if window is not None:
            seen &= k_pos > q_pos - window
        probs = scores.masked_fill(~seen, float("-inf")).softmax(-1)
        out.append(torch.einsum("htk,khd->thd", probs, v))
        start += new
    return torch.cat(out)


def _run(kernel, q, cache, meta, seqs, scale, window, out=None, softcap=0.0):
    out = torch.full(q.shape, -7.0, dtype=q.dtype) if out is None else out
    kernel(
        q, cache[0], cache[1], meta.block_tables, meta.context_lens, meta.cu_seqlens_q,
        seqs, out, scale, window or 0, softcap,
    )  # fmt: skip
    return out


CHUNKS = {
    "prompts": [(0, 1), (0, 17), (0, 64), (0, 5), (0, 33)],
    "chunks": [(48, 16), (0, 30), (100, 1), (7, 70), (31, 2)],
    "one": [(0, 129)],
}


@pytest.mark.parametrize(("kernel", "dtype"), KERNEL_CASES)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [(9, 3, 64), (4, 4, 128), (8, 1, 80), (6, 2, 72), (14, 2, 32), (10, 2, 256)],
    ids=["gqa-64", "mha-128", "mqa-80", "gqa-72", "group7-32", "gqa-256"],
)
@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("kind", list(CHUNKS))
def test_kernel_equals_float64_causal_attention(kernel, dtype, heads, kv_heads, dim, window, kind):
    chunks = CHUNKS[kind]
    cache, meta, q, keys, values = _case(heads, kv_heads, dim, dtype, chunks)
    scale = dim**-0.5
    out = _run(KERNELS[kernel][0](), q, cache, meta, list(range(len(chunks))), scale, window)
    want = _reference(q, chunks, keys, values, scale, window)
    tol = TOL[dtype]
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize(("kernel", "dtype"), KERNEL_CASES)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [(9, 3, 64), (4, 4, 128), (6, 2, 72), (14, 2, 32)],
    ids=["gqa-64", "mha-128", "gqa-72", "group7-32"],
)
@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("kind", ["prompts", "chunks"])
def test_kernel_soft_caps_as_float64_attention(kernel, dtype, heads, kv_heads, dim, window, kind):
    """Gemma 2's softcap * tanh(s / softcap) of every scaled score, before the causal / window
    mask and the softmax. The scores (q at twice unit size, scale 0.5) run well past the cap,
    so a kernel that ignored it would miss by far more than the tolerance (checked)."""
    chunks = CHUNKS[kind]
    cache, meta, q, keys, values = _case(heads, kv_heads, dim, dtype, chunks, seed=8)
    scale, softcap = 0.5, 3.0
    seqs = list(range(len(chunks)))
    out = _run(KERNELS[kernel][0](), q, cache, meta, seqs, scale, window, softcap=softcap)
    want = _reference(q, chunks, keys, values, scale, window, softcap)
    tol = TOL[dtype]
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)
    uncapped = _reference(q, chunks, keys, values, scale, window)
    assert (want - uncapped).abs().max() > 20 * tol


@pytest.mark.parametrize(("kernel", "dtype"), KERNEL_CASES[:1] + KERNEL_CASES[-1:])
def test_only_the_listed_sequences_rows_are_written(kernel, dtype):
    chunks = CHUNKS["chunks"]
    cache, meta, q, keys, values = _case(9, 3, 64, dtype, chunks, seed=2)
    out = _run(KERNELS[kernel][0](), q, cache, meta, [1, 3], 0.125, None)
    tol = TOL[dtype]
    want = _reference(q, chunks, keys, values, 0.125, None)
    bounds = meta.cu_seqlens_q.tolist()
    for i in range(len(chunks)):
        rows = slice(bounds[i], bounds[i + 1])
        if i in (1, 3):
            torch.testing.assert_close(out[rows].double(), want[rows], atol=tol, rtol=tol)
        else:
            assert bool((out[rows] == -7.0).all()), f"sequence {i} was not listed but written"


@pytest.mark.parametrize(("kernel", "dtype"), KERNEL_CASES[1:2] + KERNEL_CASES[-1:])
def test_q_may_be_a_view_into_fused_rows(kernel, dtype):
    chunks = CHUNKS["prompts"]
    cache, meta, q, _, _ = _case(9, 3, 64, dtype, chunks, seed=3)
    fused = torch.cat([q.flatten(1), torch.randn(q.shape[0], 6 * 64).to(dtype)], dim=1)
    view = fused[:, : 9 * 64].view(-1, 9, 64)
    assert not view.is_contiguous()
    kernel, seqs = KERNELS[kernel][0](), list(range(len(chunks)))
    assert torch.equal(
        _run(kernel, view, cache, meta, seqs, 0.125, None),
        _run(kernel, q, cache, meta, seqs, 0.125, None),
    )


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 24])
def test_backend_prefill_splits_between_the_kernel_and_sdpa(monkeypatch, dtype, window):
    """Small sequences go to the kernel, large ones to SDPA, in one step; the result is the
    torch path's within the dtype's rounding, and no less exact against float64."""
    chunks = [(0, 12), (0, 90), (40, 8), (64, 64), (0, 3)]
    cache, meta, q, keys, values = _case(12, 4, 64, dtype, chunks, seed=5)
    kernel, _ = torch_backend._prefill_kernel(q, cache)
    amx = dtype == torch.bfloat16 and amx_paged_prefill_kernel() is not None
    assert kernel is (amx_paged_prefill_kernel() if amx else paged_prefill_kernel())
    monkeypatch.setattr(torch_backend, "NATIVE_PREFILL_CELLS", 40 * 48)
    monkeypatch.setattr(torch_backend, "AMX_PREFILL_CELLS", 40 * 48)
    native, rest = torch_backend._native_prefill_split(
        meta, torch_backend._prefill_plan(meta, BLOCK, window), window, 40 * 48
    )
    assert native and rest, "the case must exercise both paths"
    n = q.shape[0]
    k = torch.zeros(n, 4, 64, dtype=dtype)  # prefill reads the cache, not k/v, for the kernel;
    v = torch.zeros(n, 4, 64, dtype=dtype)  # SDPA's sequences read their own tokens' rows:
    bounds = meta.cu_seqlens_q.tolist()
    for i, (prefix, _) in enumerate(chunks):
        k[bounds[i] : bounds[i + 1]] = keys[i][prefix:].to(dtype)
        v[bounds[i] : bounds[i + 1]] = values[i][prefix:].to(dtype)
    got = TorchAttentionBackend().prefill(q, k, v, cache, meta, 0.125, window)
    meta.derived.clear()
    sdpa = TorchAttentionBackend(native=False).prefill(q, k, v, cache, meta, 0.125, window)
    want = _reference(q, chunks, keys, values, 0.125, window)
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    torch.testing.assert_close(got, sdpa, atol=2 * tol, rtol=2 * tol)
    assert (got.double() - want).abs().max() <= (sdpa.double() - want).abs().max() + 1e-6


@needs_kernel
def test_refusals_name_the_problem():
    chunks = [(0, 8), (8, 8)]
    cache, meta, q, _, _ = _case(4, 2, 64, torch.float32, chunks)
    kernel = paged_prefill_kernel()
    out = torch.empty_like(q)
    args = (cache[0], cache[1], meta.block_tables, meta.context_lens)

    def call(q=q, args=args, cu=meta.cu_seqlens_q, seqs=(0, 1), out=out):
        kernel(q, *args, cu, list(seqs), out, 0.125, 0, 0.0)

    with pytest.raises(RuntimeError, match="outside 0..1"):
        call(seqs=(2,))
    with pytest.raises(RuntimeError, match="must run from 0 to 16"):
        call(cu=torch.tensor([0, 8, 15], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="has 9 queries but a context of 8"):
        call(cu=torch.tensor([0, 9, 16], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="contiguous tensor of q's shape"):
        call(out=torch.empty(16, 4, 32))
    with pytest.raises(RuntimeError, match="share a dtype"):
        call(q=q.double(), out=out.double())
    with pytest.raises(RuntimeError, match="softcap must be 0 .none. or positive"):
        kernel(q, *args, meta.cu_seqlens_q, [0, 1], out, 0.125, 0, -2.0)
    bad_tables = meta.block_tables.clone()
    bad_tables[1, 0] = 10_000
    with pytest.raises(RuntimeError, match="not in the cache"):
        call(args=(cache[0], cache[1], bad_tables, meta.context_lens))
    # An empty list computes nothing and checks no table.
    call(seqs=(), args=(cache[0], cache[1], bad_tables, meta.context_lens))


@needs_amx
def test_the_tile_kernel_refuses_what_the_tile_unit_cannot_take():
    kernel = amx_paged_prefill_kernel()
    for dtype, dim, match in [(torch.float32, 64, "bf16 only"), (torch.bfloat16, 63, "even")]:
        cache, meta, q, _, _ = _case(4, 2, dim, dtype, [(0, 8), (8, 8)])
        with pytest.raises(RuntimeError, match=match):
            _run(kernel, q, cache, meta, [0, 1], 0.125, None)
    cache, meta, q, _, _ = _case(4, 2, 64, torch.bfloat16, [(0, 8), (8, 8)])
    with pytest.raises(RuntimeError, match="amx_paged_prefill: sequence 2 outside 0..1"):
        _run(kernel, q, cache, meta, [2], 0.125, None)
