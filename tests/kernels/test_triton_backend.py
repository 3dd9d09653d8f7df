"""The triton backend behind the AttentionBackend interface, step by step against the torch
backend on the same cache: prefill (with a cached prefix), KV write, then decode."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, REFERENCE, TOLERANCES, PagedBatch, as_float, fill_cache, randn

from shard.attention import MixedMetadata, attend, get_attention_backend
from shard.platforms.cuda.attention import TritonAttentionBackend


def test_prefill_then_decode_through_the_interface():
    backend = get_attention_backend("triton")
    assert isinstance(backend, TritonAttentionBackend)
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, d, scale = 4, 2, 64, 0.125
    prefixes, totals = [0, 18], [23, 30]
    batch = PagedBatch.allocate([n + 4 for n in totals], block_size=16)
    cache = batch.empty_cache(kv_heads, d, torch.float32)
    fill_cache(batch, cache, prefixes, gen)
    ref_cache = cache.clone()

    meta = batch.prefill_meta(prefixes, totals)
    tokens = meta.slot_mapping.numel()
    q, k, v = (
        randn(tokens, h, d, dtype=torch.float32, gen=gen) for h in (heads, kv_heads, kv_heads)
    )
    backend.store_kv(k, v, cache, meta.slot_mapping)
    REFERENCE.store_kv(k, v, ref_cache, meta.slot_mapping)
    torch.testing.assert_close(cache, ref_cache, rtol=0, atol=0, equal_nan=True)
    out = backend.prefill(q, k, v, cache, meta, scale)
    ref_meta, ref_cache_f = as_float(meta, cache)
    expected = REFERENCE.prefill(q.cpu(), k.cpu(), v.cpu(), ref_cache_f, ref_meta, scale)
    torch.testing.assert_close(out.cpu(), expected, **TOLERANCES[torch.float32])

    meta = batch.decode_meta([n + 1 for n in totals])
    q, k, v = (randn(2, h, d, dtype=torch.float32, gen=gen) for h in (heads, kv_heads, kv_heads))
    backend.store_kv(k, v, cache, meta.slot_mapping)
    REFERENCE.store_kv(k, v, ref_cache, meta.slot_mapping)
    out = backend.decode(q, cache, meta, scale)
    ref_meta, ref_cache = as_float(meta, ref_cache)
    expected = REFERENCE.decode(q.cpu(), ref_cache, ref_meta, scale)
    torch.testing.assert_close(out.cpu(), expected, **TOLERANCES[torch.float32])


@pytest.mark.parametrize("window", [None, 9])
def test_a_mixed_chunked_prefill_step_equals_its_parts(window):
    """Chunked prefill: a fresh prompt chunk, a chunk after a cached prefix and a decode token in
    one step; attend() splits it between the prefill and decode kernels, window and all."""
    backend = get_attention_backend("triton")
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, d, scale = 4, 2, 64, 0.125
    full = PagedBatch.allocate([40, 40, 40], block_size=16)
    cache = full.empty_cache(kv_heads, d, torch.float32)
    fill_cache(full, cache, [0, 18, 24], gen)
    ref_cache = cache.clone()
    prefill = PagedBatch(full.tables[:2], 16, full.num_blocks).prefill_meta([0, 18], [20, 30])
    decode = PagedBatch(full.tables[2:], 16, full.num_blocks).decode_meta([25])
    n = prefill.slot_mapping.numel()
    meta = MixedMetadata(
        slot_mapping=torch.cat([prefill.slot_mapping, decode.slot_mapping]),
        prefill=prefill,
        decode=decode,
        num_prefill_tokens=n,
    )
    shapes = (heads, kv_heads, kv_heads)
    q, k, v = (randn(n + 1, h, d, dtype=torch.float32, gen=gen) for h in shapes)
    out = attend(backend, q, k, v, cache, meta, scale, window)

    REFERENCE.store_kv(k, v, ref_cache, meta.slot_mapping)
    torch.testing.assert_close(cache, ref_cache, rtol=0, atol=0, equal_nan=True)
    pre_meta, ref_f = as_float(prefill, ref_cache)
    dec_meta, _ = as_float(decode, ref_cache)
    expected = torch.cat([
        REFERENCE.prefill(q[:n].cpu(), k[:n].cpu(), v[:n].cpu(), ref_f, pre_meta, scale, window),
        REFERENCE.decode(q[n:].cpu(), ref_f, dec_meta, scale, window),
    ])  # fmt: skip
    torch.testing.assert_close(out.cpu(), expected, **TOLERANCES[torch.float32])


@pytest.mark.skipif(DEVICE.type == "cuda", reason="checks the CPU-without-interpreter error")
def test_refuses_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1.*--attention torch"):
        TritonAttentionBackend()
