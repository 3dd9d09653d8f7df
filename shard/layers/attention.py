"""Attention over a paged KV cache, behind one backend interface.

The KV cache of a layer is [2, num_blocks, block_size, Hkv, D]; flattening the block and offset
dims gives one row per slot (`slot = block * block_size + offset`), which is how new tokens are
written and how a block table turns positions into rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    is_prefill: bool
    slot_mapping: torch.Tensor  # [T] int64, cache slot of each new token (T = tokens this step)
    block_tables: torch.Tensor  # [B, max_blocks] int32, rows padded with 0
    context_lens: torch.Tensor  # [B] int32, tokens of each sequence in the cache after this step
    cu_seqlens_q: torch.Tensor | None = None  # prefill: [B+1] int32, packed query offsets
    max_seqlen_q: int = 0  # prefill: longest query
    max_seqlen_k: int = 0  # prefill: longest context (== max_seqlen_q without cached prefix)


@dataclass
class MixedMetadata:
    """One forward pass over prompt chunks and single-token rows together (chunked prefill).

    The packed tokens hold the prefill part first (`num_prefill_tokens` of them, varlen, each
    sequence's cached prefix read from the cache) and then one token per decode-part sequence,
    so each part goes through the kernel made for it. Either part may be absent.
    """

    slot_mapping: torch.Tensor  # [T] int64, every new token of the step
    prefill: AttentionMetadata | None
    decode: AttentionMetadata | None
    num_prefill_tokens: int


# What a model's forward pass takes: a pure prefill or decode step, or a mixed one.
StepMetadata = AttentionMetadata | MixedMetadata


def attend(
    backend: AttentionBackend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: StepMetadata,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Stores the step's new K/V, then attends each token over its sequence's context, or over
    the last `window` positions of it (itself included) for a sliding-window layer."""
    backend.store_kv(k, v, kv_cache, meta.slot_mapping)
    if isinstance(meta, AttentionMetadata):
        if meta.is_prefill:
            return backend.prefill(q, k, v, kv_cache, meta, scale, window)
        return backend.decode(q, kv_cache, meta, scale, window)
    n = meta.num_prefill_tokens
    parts = []
    if meta.prefill is not None:
        parts.append(backend.prefill(q[:n], k[:n], v[:n], kv_cache, meta.prefill, scale, window))
    if meta.decode is not None:
        parts.append(backend.decode(q[n:], kv_cache, meta.decode, scale, window))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class AttentionBackend(Protocol):
    """`window`: None for full causal attention; W for sliding-window attention, where the query
    at position p sees the keys at positions p - W + 1 .. p (Mistral; Qwen2's sliding layers)."""

    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...

    def prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor: ...

    def decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor: ...


def _slot_rows(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values as [num_blocks * block_size, Hkv, D] views of the cache."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    rows = num_blocks * block_size
    return kv_cache[0].view(rows, num_kv_heads, head_dim), kv_cache[1].view(
        rows, num_kv_heads, head_dim
    )


def _slots(block_tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slot of each position through each row's block table: [B, P] for positions [P]
    shared by every row, or for per-row positions [B, P]."""
    tables = block_tables.long()
    index = positions // block_size
    blocks = tables[:, index] if positions.dim() == 1 else tables.gather(1, index)
    return blocks * block_size + positions % block_size


def _decode_gather_index(
    meta: AttentionMetadata, block_size: int, window: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slot of every position each sequence's query sees, [B, width], and which are real.

    A row covers its last `width` positions: the whole context (width = longest context), or
    with a sliding window only the window (width = min(longest context, window)), so a long
    context costs no more than its window. The same for every layer with the same window, so
    it is computed once per step and kept on the metadata object (which lives for one step).
    """
    cache = meta.__dict__.setdefault("_torch_decode_index", {})
    if window in cache:
        return cache[window]
    context_lens = meta.context_lens.long()
    max_ctx = int(context_lens.max())
    width = max_ctx if window is None else min(max_ctx, window)
    first = (context_lens - width).clamp_(min=0)
    positions = first[:, None] + torch.arange(width, device=context_lens.device)
    valid = positions < context_lens[:, None]
    # Padded positions read the row's position 0, whatever it holds; their scores are masked.
    cache[window] = (_slots(meta.block_tables, positions.masked_fill(~valid, 0), block_size), valid)
    return cache[window]


class TorchAttentionBackend:
    """Reference backend in plain torch: correct everywhere, fast nowhere in particular."""

    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        keys, values = _slot_rows(kv_cache)
        slots = slot_mapping.long()  # index_copy_ wants int64; callers may hand us int32
        keys.index_copy_(0, slots, key.to(keys.dtype))
        values.index_copy_(0, slots, value.to(values.dtype))

    def prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        """Causal attention per packed sequence; a cached prefix (context_lens > query length)
        is read from the cache and comes before the new tokens. With a window, only the part
        of the prefix the first query can see is read."""
        assert meta.cu_seqlens_q is not None, "prefill needs cu_seqlens_q"
        keys, values = _slot_rows(kv_cache)
        block_size = kv_cache.shape[2]
        bounds = meta.cu_seqlens_q.tolist()
        context_lens = meta.context_lens.tolist()
        out = torch.empty_like(q)
        for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            q_len, prefix = stop - start, context_lens[i] - (stop - start)
            first = 0 if window is None else max(0, prefix - window + 1)
            k_i, v_i = k[start:stop], v[start:stop]
            if prefix > first:
                slots = _slots(
                    meta.block_tables[i : i + 1],
                    torch.arange(first, prefix, device=q.device),
                    block_size,
                )[0]
                k_i = torch.cat([keys[slots].to(k.dtype), k_i])
                v_i = torch.cat([values[slots].to(v.dtype), v_i])
            # Query j sits at position prefix + j and sees keys up to there (and, with a
            # window, only those within `window` positions of it).
            q_pos = torch.arange(prefix, prefix + q_len, device=q.device)[:, None]
            k_pos = torch.arange(first, prefix + q_len, device=q.device)[None, :]
            mask = k_pos <= q_pos
            if window is not None:
                mask &= k_pos > q_pos - window
            o = F.scaled_dot_product_attention(
                q[start:stop].transpose(0, 1),
                k_i.transpose(0, 1),
                v_i.transpose(0, 1),
                attn_mask=mask,
                scale=scale,
                enable_gqa=True,
            )
            out[start:stop] = o.transpose(0, 1)
        return out

    def decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        """One query per sequence against its context (or its window), all sequences in one
        batched pass: every row gathers the same number of slots and masks the ones it lacks.

        Plain matmuls rather than SDPA: with one query row, SDPA's per-call overhead on CPU
        costs more than the arithmetic. Query heads are grouped by the KV head they share, so
        K/V are never repeated; scores and softmax are in fp32. K/V are gathered with
        index_select (several times faster than advanced indexing on CPU) and converted to fp32
        straight into a heads-first layout, so both matmuls read them without another copy.
        """
        keys, values = _slot_rows(kv_cache)
        slots, valid = _decode_gather_index(meta, kv_cache.shape[2], window)
        batch, num_heads, head_dim = q.shape
        num_kv_heads = keys.shape[1]
        flat = slots.reshape(-1)

        def heads_first(rows: torch.Tensor) -> torch.Tensor:  # -> [B, Hkv, width, D] fp32
            gathered = rows.index_select(0, flat).view(batch, -1, num_kv_heads, head_dim)
            return gathered.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)

        grouped = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim).float()
        k = heads_first(keys)
        # Masked scores drop padded keys even when they hold NaN; padded values must be zeroed,
        # as a zero weight times NaN is still NaN.
        v = heads_first(values).masked_fill_(~valid[:, None, :, None], 0)
        scores = torch.matmul(grouped, k.transpose(-1, -2)).mul_(scale)  # [B, Hkv, G, width]
        scores.masked_fill_(~valid[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, v).reshape(batch, num_heads, head_dim).to(q.dtype)


_BACKENDS = {"torch": TorchAttentionBackend}


def get_attention_backend(name: str) -> AttentionBackend:
    if name == "triton":
        # Imported on demand: triton is only a dependency where this backend is used, and
        # TRITON_INTERPRET must be set before triton is first imported.
        try:
            from shard.layers.attention_triton import TritonAttentionBackend
        except ImportError as e:
            raise ValueError(f"attention backend 'triton' needs the triton package: {e}") from e
        return TritonAttentionBackend()
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(_BACKENDS)}")
    return _BACKENDS[name]()
