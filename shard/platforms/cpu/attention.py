"""The reference attention backend in plain torch (the CPU path): correct everywhere, fast
nowhere in particular; on the CPU its decode, and the prefill of short prompts and chunks, run
native kernels where they could be built (shard/platforms/cpu/native/build.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shard.attention.metadata import AttentionMetadata
from shard.platforms.cpu.native.build import (
    amx_paged_prefill_kernel,
    paged_decode_kernel,
    paged_prefill_kernel,
    store_kv_kernel,
)
from shard.platforms.cpu.native.eager import heads_contiguous

# A prefill sequence whose queries x keys seen is at most this runs the native kernel, all such
# sequences of a step in one call a layer; larger ones keep SDPA, whose blocked GEMMs beat the
# kernel's FMAs per score from there (bf16, 2-vCPU Xeon, the SmolLM2 shape, one layer: 16
# prompts of 64 tokens 0.49 ms in one call against 1.0 ms for SDPA's 16 calls before the ~40 us
# of slicing each costs in a step; one prompt of 128 / 256 tokens 0.12 / 0.43 ms against 0.13 /
# 0.28; a 64-token chunk after 192 cached 0.21 against 0.13).
NATIVE_PREFILL_CELLS = 128 * 160
# The same line for the bf16 kernel on the AMX tile unit (paged_prefill_amx.cpp), which computes
# both products as tile products and beats SDPA further (same machine and shape, 30 layers: 16
# prompts of 128 tokens 36 ms against SDPA's 45, 4 of 512 84 against 95; one of 1,024 87
# against 66).
AMX_PREFILL_CELLS = 512 * 512
# The explicit-scores path (soft-capped scores or sinks, which SDPA cannot compute) materialises a
# sequence's fp32 scores: queries go through it in chunks of at most this many scores (64 MiB),
# so a long prompt costs bounded memory rather than q_len x keys x heads at once.
EXPLICIT_SCORES_PER_CHUNK = 1 << 24


def _prefill_kernel(q: torch.Tensor, kv_cache: torch.Tensor):  # -> (kernel, cells) | (None, 0)
    """The native prefill kernel for this step's tensors and the largest sequence it takes."""
    if q.device.type != "cpu" or kv_cache.dtype != q.dtype or not heads_contiguous(q):
        return None, 0
    if q.dtype == torch.bfloat16 and q.shape[-1] % 2 == 0:
        amx = amx_paged_prefill_kernel()
        if amx is not None:
            return amx, AMX_PREFILL_CELLS
    kernel = paged_prefill_kernel()
    return (kernel, NATIVE_PREFILL_CELLS) if kernel is not None else (None, 0)


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
    meta: AttentionMetadata,
    block_size: int,
    window: int | None,
    dtype: torch.dtype,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slot of every position each sequence's query sees, flattened from [B, width], and
    the additive score mask [B, 1, 1, width] in `dtype` (0 where the position is real, -inf
    where it is padding): SDPA adds a mask of the query's dtype as it is, where a boolean one
    costs two more ops in every layer to convert.

    A row covers its last `width` positions: the whole context (width = longest context), or
    with a sliding window only the window (width = min(longest context, window)), so a long
    context costs no more than its window; with chunks, the row's own chunk up to its query
    (width = min(longest context, chunk), from the chunk's first position). The same for every
    layer with the same window and chunk, so it is computed once per step and kept in the
    metadata's `derived` (which lives for one step).
    """
    key = ("torch_decode_index", window, chunk, dtype)
    if key in meta.derived:
        return meta.derived[key]  # type: ignore[return-value]
    positions, last = _decode_positions(meta, block_size, window, chunk)
    # A padded position reads the row's own newest slot, written by this very step: its value
    # is finite whenever the row's own output is, so a zero weight on it adds exactly zero and
    # no other sequence's (or never-written) slot can leak a NaN into this row.
    slots = _slots(meta.block_tables, torch.minimum(positions, last), block_size)
    bias = torch.zeros(positions.shape, dtype=dtype, device=positions.device)
    bias.masked_fill_(positions > last, float("-inf"))
    index = (slots.reshape(-1), bias[:, None, None, :])
    meta.derived[key] = index
    return index


def _decode_positions(
    meta: AttentionMetadata, block_size: int, window: int | None, chunk: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions [B, width] each decode row's gathered keys hold (past the row's context:
    padding) and each row's query position [B, 1] (`_decode_gather_index` says how wide)."""
    context_lens = meta.context_lens.long()
    if meta.captured:  # no host read: the widest context the block table can hold
        max_ctx = meta.block_tables.shape[1] * block_size
    else:
        max_ctx = int(context_lens.max())
    span = window or chunk
    width = max_ctx if span is None else min(max_ctx, span)
    if chunk is None:
        first = (context_lens - width).clamp_(min=0)
    else:  # the query, at position context_len - 1, sees its chunk from the chunk's start
        first = (context_lens - 1).div_(chunk, rounding_mode="floor").mul_(chunk)
    positions = first[:, None] + torch.arange(width, device=context_lens.device)
    return positions, context_lens[:, None] - 1


def _decode_distances(
    meta: AttentionMetadata, block_size: int, window: int | None, chunk: int | None
) -> torch.Tensor:
    """ALiBi's key position - query position [B, 1, 1, 1, width] in float32 for each decode
    row's gathered keys (padding's are masked anyway), once per step, window and chunk."""
    key = ("torch_decode_distances", window, chunk)
    if key not in meta.derived:
        positions, last = _decode_positions(meta, block_size, window, chunk)
        meta.derived[key] = (positions - last).float()[:, None, None, None, :]
    return meta.derived[key]  # type: ignore[return-value]


def _native_prefill_split(
    meta: AttentionMetadata,
    plan: list[_PrefillSequence],
    window: int | None,
    cells: int,
    chunk: int | None = None,
) -> tuple[list[int], list[int]]:
    """The step's prefill sequences (indices into the plan) whose queries x keys are at most
    `cells`, for the native kernel, and the others; once per step, window, chunk and line.
    The kernel has no chunks: with them, only sequences within their first chunk (where
    chunking changes nothing) are its."""
    key = ("native_prefill_split", window, chunk, cells)
    if key not in meta.derived:
        native, rest = [], []
        for i, (seq, context) in enumerate(zip(plan, meta.context_lens.tolist(), strict=True)):
            q_len = seq.stop - seq.start
            keys = context if window is None else min(context, window + q_len - 1)
            fits = q_len * keys <= cells and (chunk is None or context <= chunk)
            (native if fits else rest).append(i)
        meta.derived[key] = (native, rest)
    return meta.derived[key]  # type: ignore[return-value]


def _beyond_first_chunk(meta: AttentionMetadata, chunk: int) -> bool:
    """Whether some sequence's context passes its first attention chunk (once per step)."""
    key = ("beyond_first_chunk", chunk)
    if key not in meta.derived:
        meta.derived[key] = int(meta.context_lens.max()) > chunk
    return meta.derived[key]  # type: ignore[return-value]


@dataclass(frozen=True)
class _PrefillSequence:
    """One packed sequence of a prefill step, as every layer with the same window (or chunk)
    sees it."""

    start: int  # its query tokens in the packed step
    stop: int
    prefix_slots: torch.Tensor | None  # cache rows of the cached prefix it reads, if any
    mask: torch.Tensor | None  # [q_len, keys] bool; None: plain causal over its own tokens
    key_start: int = 0  # the position of its first key read (ALiBi's distances)
    query_start: int = 0  # ... and of its first query


def _prefill_plan(
    meta: AttentionMetadata, block_size: int, window: int | None, chunk: int | None = None
) -> list[_PrefillSequence]:
    """Each sequence's query range, prefix rows and mask, computed once per step, window and
    chunk (the metadata's `derived`) rather than once per layer: building them costs ~10 small
    ops a sequence. A sequence that reads no cached prefix and whose window (if any) spans its
    whole prefill chunk, or whose queries lie in one attention chunk starting at its first
    query, is plain causal attention: SDPA's is_causal takes no mask and skips the blocks above
    the diagonal instead of computing and discarding them."""
    key = ("torch_prefill_plan", window, chunk)
    if key in meta.derived:
        return meta.derived[key]  # type: ignore[return-value]
    assert meta.cu_seqlens_q is not None, "prefill needs cu_seqlens_q"
    device = meta.block_tables.device
    bounds = meta.cu_seqlens_q.tolist()
    plan = []
    for i, (start, stop, context) in enumerate(
        zip(bounds[:-1], bounds[1:], meta.context_lens.tolist(), strict=True)
    ):
        q_len, prefix = stop - start, context - (stop - start)
        first = 0 if window is None else max(0, prefix - window + 1)
        if chunk is not None:  # the first query's attention chunk
            first = prefix // chunk * chunk
        one_chunk = chunk is None or (prefix + q_len - 1) // chunk == first // chunk
        if prefix == first and (window is None or window >= q_len) and one_chunk:
            plan.append(_PrefillSequence(start, stop, None, None))
            continue
        slots = None
        if prefix > first:
            positions = torch.arange(first, prefix, device=device)
            slots = _slots(meta.block_tables[i : i + 1], positions, block_size)[0]
        # Query j sits at position prefix + j and sees keys up to there (and, with a
        # window, only those within `window` positions of it; with chunks, those of its chunk).
        q_pos = torch.arange(prefix, prefix + q_len, device=device)[:, None]
        k_pos = torch.arange(first, prefix + q_len, device=device)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
        if chunk is not None:
            mask &= k_pos >= q_pos // chunk * chunk
        plan.append(_PrefillSequence(start, stop, slots, mask, first, prefix))
    meta.derived[key] = plan
    return plan


def _explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seen: torch.Tensor | None,
    scale: float,
    softcap: float | None,
    sinks: torch.Tensor | None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention written out: scores, cap, bias, mask, softmax, weighted values, all in fp32 (or
    wider) and rounded once. SDPA has no hook between its scores and its softmax, so this is
    what every soft-capped call (Gemma 2), call with sinks (gpt-oss) or with ALiBi (BLOOM, MPT)
    takes that no native kernel does. `bias`: added to the capped scores (ALiBi's), broadcast
    to them as `seen` is.

    q [N, Hkv, G, M, D] (the G query heads sharing each KV head, M query rows each), k and v
    [N, Hkv, n, D]; `seen` boolean, broadcastable to the scores [N, Hkv, G, M, n], True where a
    row sees a key (None: every key); `sinks` [Hkv * G] (query head h = kv_head * G + g), each
    head's extra softmax logit with no value. Returns [N, Hkv, G, M, D] in q's dtype. Each KV
    head is read once for its whole group (a [G * M, D] x [D, n] product), never repeated per
    head."""
    n_seq, kv_heads, group, rows, dim = q.shape
    wide = torch.promote_types(q.dtype, torch.float32)
    qf = q.reshape(n_seq, kv_heads, group * rows, dim).to(wide)
    scores = torch.matmul(qf, k.to(wide).transpose(-1, -2)).mul_(scale)
    scores = scores.view(n_seq, kv_heads, group, rows, -1)
    if softcap:  # Gemma 2's order: cap the scaled score, then mask, then the softmax.
        scores = scores.div_(softcap).tanh_().mul_(softcap)
    if bias is not None:
        scores = scores.add_(bias)
    if seen is not None:
        scores.masked_fill_(~seen, float("-inf"))
    if sinks is None:
        probs = scores.softmax(-1)
    else:  # the sink as one more column of the softmax, dropped after it (transformers' form)
        sink = sinks.to(wide).view(1, kv_heads, group, 1, 1).expand(n_seq, -1, -1, rows, 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    probs = probs.reshape(n_seq, kv_heads, group * rows, -1)
    out = torch.matmul(probs, v.to(wide))
    return out.view(n_seq, kv_heads, group, rows, dim).to(q.dtype)


def _explicit_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float | None,
    sinks: torch.Tensor | None,
    alibi: torch.Tensor | None = None,
    key_start: int = 0,
    query_start: int = 0,
) -> torch.Tensor:
    """One sequence's prefill through `_explicit_attention`: q [T, H, D] over its keys k, v
    [n, Hkv, D] (the cached prefix, then its own T tokens), `mask` [T, n] (None: plain causal,
    n == T), in chunks of queries of at most EXPLICIT_SCORES_PER_CHUNK scores -> [T, H, D].
    With `alibi` ([H] slopes), the keys are at positions key_start .., the queries at
    query_start .."""
    tokens, heads, dim = q.shape
    keys, kv_heads = k.shape[0], k.shape[1]
    group = heads // kv_heads
    if mask is None:
        mask = torch.ones(tokens, keys, dtype=torch.bool, device=q.device).tril_(keys - tokens)
    # [T, Hkv, G, D] -> [1, Hkv, G, T, D]; K/V heads first: [1, Hkv, n, D].
    qh = q.reshape(tokens, kv_heads, group, dim).permute(1, 2, 0, 3)[None]
    kh, vh = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    out = torch.empty_like(q)
    distances = slopes = None
    if alibi is not None:
        k_pos = torch.arange(key_start, key_start + keys, device=q.device)
        q_pos = torch.arange(query_start, query_start + tokens, device=q.device)
        distances = (k_pos[None, :] - q_pos[:, None]).float()
        slopes = alibi.view(1, kv_heads, group, 1, 1)
    step = max(1, EXPLICIT_SCORES_PER_CHUNK // (heads * keys))
    for a in range(0, tokens, step):
        b = min(tokens, a + step)
        bias = None if distances is None else slopes * distances[a:b]
        o = _explicit_attention(qh[..., a:b, :], kh, vh, mask[a:b], scale, softcap, sinks, bias)
        out[a:b] = o[0].permute(2, 0, 1, 3).reshape(b - a, heads, dim)
    return out


class TorchAttentionBackend:
    """Reference backend in plain torch: correct everywhere, fast nowhere in particular.

    `native`: on the CPU, decode attention and the K/V write run the native kernels where they
    could be built (the default); False keeps the torch path, which the benchmark and the tests
    time and check beside it."""

    def __init__(self, native: bool = True) -> None:
        self.native = native

    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        one_plane = kv_cache.stride(0) == 0  # the values are the keys (latent attention)
        kernel = store_kv_kernel() if self.native and key.device.type == "cpu" else None
        if kernel is not None and key.dtype == value.dtype == kv_cache.dtype and not one_plane:
            kernel(key, value, kv_cache, slot_mapping)
            return
        keys, values = _slot_rows(kv_cache)
        slots = slot_mapping.long()  # index_copy_ wants int64; callers may hand us int32
        keys.index_copy_(0, slots, key.to(keys.dtype))
        if one_plane:
            return
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
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        *,
        chunk: int | None = None,
        alibi: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal attention per packed sequence; a cached prefix (context_lens > query length)
        is read from the cache and comes before the new tokens. With a window, only the part
        of the prefix the first query can see is read. With `softcap`, the native kernels cap
        the scores themselves; the sequences SDPA would take (it cannot cap) take the explicit
        scores path instead, as every sequence does with `sinks` or `alibi` (no native prefill
        kernel has them)."""
        plan = _prefill_plan(meta, kv_cache.shape[2], window, chunk)
        sequences: list[int] | range = range(len(plan))
        native = self.native and sinks is None and alibi is None
        kernel, cells = _prefill_kernel(q, kv_cache) if native else (None, 0)
        if kernel is not None:
            native, sequences = _native_prefill_split(meta, plan, window, cells, chunk)
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            kernel(
                q, kv_cache[0], kv_cache[1], meta.block_tables, meta.context_lens,
                meta.cu_seqlens_q, native, out, scale, window or 0, softcap or 0.0,
            )  # fmt: skip
        else:
            out = torch.empty_like(q)
        keys, values = _slot_rows(kv_cache)
        for i in sequences:
            seq = plan[i]
            k_i, v_i = k[seq.start : seq.stop], v[seq.start : seq.stop]
            if seq.prefix_slots is not None:
                k_i = torch.cat([keys.index_select(0, seq.prefix_slots).to(k.dtype), k_i])
                v_i = torch.cat([values.index_select(0, seq.prefix_slots).to(v.dtype), v_i])
            if softcap or sinks is not None or alibi is not None:
                out[seq.start : seq.stop] = _explicit_prefill(
                    q[seq.start : seq.stop], k_i, v_i, seq.mask, scale, softcap, sinks,
                    alibi, seq.key_start, seq.query_start,
                )  # fmt: skip
                continue
            # A leading batch dim of 1: with 4-D inputs torch's CPU SDPA takes its fused
            # flash kernel; 3-D ones fall back to the unfused math path, 2-3x slower for a
            # 256-token chunk (bench/sdpa_layouts.py).
            o = F.scaled_dot_product_attention(
                q[seq.start : seq.stop].transpose(0, 1)[None],
                k_i.transpose(0, 1)[None],
                v_i.transpose(0, 1)[None],
                attn_mask=seq.mask,
                is_causal=seq.mask is None,
                scale=scale,
                enable_gqa=True,
            )
            out[seq.start : seq.stop] = o[0].transpose(0, 1)
        return out

    def decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        *,
        chunk: int | None = None,
        alibi: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One query per sequence against its context (or its window, or its chunk). On the
        CPU, the native paged kernel (shard/platforms/cpu/native/build.py) where it could be
        built (it has no chunks: not for a step past its first); otherwise all sequences in one
        batched pass: every row gathers the same number of slots and masks the ones it lacks.
        With `softcap`, the kernel caps the scores itself; the batched pass then computes its
        scores explicitly (_explicit_attention) instead of through SDPA, which cannot cap, as
        it does with `sinks` or `alibi` (the kernel counts both in its scores).

        K/V are gathered with index_select (several times faster than advanced indexing on CPU)
        and handed to SDPA as heads-first strided views of the gathered rows, 4-D, so torch's
        CPU flash kernel takes them as they are: it accumulates scores and softmax in fp32
        without a widened copy of K/V, and shares each KV head among its query heads
        (enable_gqa) without repeating it. Against the former plain-matmul path on fp32 copies
        this halves the layer's attention time at batch 16 (bench/decode_attention.py); 3-D
        inputs would take SDPA's unfused math path, which is slower than either.
        """
        kernel = paged_decode_kernel() if self.native and q.device.type == "cpu" else None
        if chunk is not None and kernel is not None and _beyond_first_chunk(meta, chunk):
            kernel = None
        if kernel is not None and kv_cache.dtype == q.dtype:
            return kernel(
                q if heads_contiguous(q) else q.contiguous(),
                kv_cache[0],
                kv_cache[1],
                meta.block_tables,
                meta.context_lens,
                scale,
                window or 0,
                softcap or 0.0,
                sinks,
                alibi,
            )
        keys, values = _slot_rows(kv_cache)
        flat, mask = _decode_gather_index(meta, kv_cache.shape[2], window, q.dtype, chunk)
        batch, num_heads, head_dim = q.shape
        num_kv_heads = keys.shape[1]

        def heads_first(rows: torch.Tensor) -> torch.Tensor:  # -> [B, Hkv, width, D], a view
            gathered = rows.index_select(0, flat).view(batch, -1, num_kv_heads, head_dim)
            return gathered.transpose(1, 2).to(q.dtype)

        if softcap or sinks is not None or alibi is not None:
            group = num_heads // num_kv_heads
            bias = None
            if alibi is not None:  # [B, Hkv, G, 1, width]
                distances = _decode_distances(meta, kv_cache.shape[2], window, chunk)
                bias = alibi.view(1, num_kv_heads, group, 1, 1) * distances
            # One query row per sequence: [B, Hkv, G, 1, D]; the additive mask's zeros are the
            # positions each row sees, as [B, 1, 1, 1, width] over the scores.
            out = _explicit_attention(
                q.reshape(batch, num_kv_heads, group, 1, head_dim),
                heads_first(keys),
                heads_first(values),
                (mask == 0)[:, :, :, None],
                scale,
                softcap,
                sinks,
                bias,
            )
            return out.reshape(batch, num_heads, head_dim)
        out = F.scaled_dot_product_attention(
            q[:, :, None],
            heads_first(keys),
            heads_first(values),
            attn_mask=mask,
            scale=scale,
            enable_gqa=num_heads != num_kv_heads,
        )
        return out[:, :, 0]
