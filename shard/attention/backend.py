"""The attention backend interface, the one entry point models call (`attend`), and the
registry of backends by the name `--attention` takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from shard.attention.metadata import AttentionMetadata, StepMetadata

# What `attend` becomes inside a graph traced for --compile: one opaque op that reads the step's
# metadata, registered by shard/platforms/cpu/compiled.py (which owns it) when it is imported,
# so that this module imports no platform.
_graph_attend: Callable[..., torch.Tensor] | None = None


def register_graph_attend(op: Callable[..., torch.Tensor]) -> None:
    global _graph_attend
    _graph_attend = op


def attend(
    backend: AttentionBackend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: StepMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    store: bool = True,
    chunk: int | None = None,
    alibi: torch.Tensor | None = None,
) -> torch.Tensor:
    """Stores the step's new K/V (unless `store` is False: another layer's, already in the
    cache this layer reads, Gemma 4's KV sharing), then attends each token over its sequence's
    context, or over the last `window` positions of it (itself included) for a sliding-window
    layer, or over the positions of its own chunk of `chunk` (Llama 4's local layers); with
    `softcap`, each scaled score s becomes softcap * tanh(s / softcap) before the mask and the
    softmax (Gemma 2); with `sinks` ([query heads] float32, gpt-oss), each head's softmax
    denominator also counts exp(sinks[h]), a logit with no value; with `alibi` ([query heads]
    float32 slopes, BLOOM, MPT), head h adds alibi[h] * (key position - query position) to each
    (capped) score before the mask."""
    softcap = softcap or None  # 0 means off, as the kernels take it: one spelling from here on
    if torch.compiler.is_compiling():  # --compile: one opaque op reading the step's metadata
        assert _graph_attend is not None, "a traced attend needs --compile's op registered"
        # (its op always stores: for a layer reading another's K/V, the same values again)
        return _graph_attend(q, k, v, kv_cache, scale, window, softcap, sinks, chunk, alibi)
    if store:
        backend.store_kv(k, v, kv_cache, meta.slot_mapping)
    if isinstance(meta, AttentionMetadata):
        if meta.is_prefill:
            return backend.prefill(
                q, k, v, kv_cache, meta, scale, window, softcap, sinks, chunk=chunk, alibi=alibi
            )
        return backend.decode(
            q, kv_cache, meta, scale, window, softcap, sinks, chunk=chunk, alibi=alibi
        )
    n = meta.num_prefill_tokens
    parts = []
    if meta.prefill is not None:
        parts.append(
            backend.prefill(
                q[:n],
                k[:n],
                v[:n],
                kv_cache,
                meta.prefill,
                scale,
                window,
                softcap,
                sinks,
                chunk=chunk,
                alibi=alibi,
            )  # fmt: skip
        )
    if meta.decode is not None:
        parts.append(
            backend.decode(
                q[n:], kv_cache, meta.decode, scale, window, softcap, sinks, chunk=chunk,
                alibi=alibi,
            )
        )  # fmt: skip
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class AttentionBackend(Protocol):
    """`window`: None for full causal attention; W for sliding-window attention, where the query
    at position p sees the keys at positions p - W + 1 .. p (Mistral; Qwen2's sliding layers).

    `chunk` (keyword): None, or C for chunked attention (Llama 4's local layers): the query at
    position p sees the keys at positions p // C * C .. p, those of its own chunk of C.

    `softcap`: None (or 0) for plain scores; C for attention-logit soft-capping (Gemma 2): each
    scaled score s = (q . k) * scale is replaced by C * tanh(s / C) before the causal / window
    mask and the softmax. A backend must honour it on every path it takes, or refuse.

    `sinks`: None, or [query heads] float32 (gpt-oss's attention sinks): query head h's softmax
    denominator also counts exp(sinks[h]), a logit used as it is (not scaled, not capped) that
    has no value vector: p_j = exp(s_j) / (sum_i exp(s_i) + exp(sinks[h])).

    `alibi` (keyword): None, or [query heads] float32 slopes (ALiBi: BLOOM, MPT): query head h
    at position p adds alibi[h] * (j - p) to its score for the key at position j, after the cap
    and before the mask and the softmax. A backend must honour it on every path, or refuse."""

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
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        *,
        chunk: int | None = None,
        alibi: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

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
    ) -> torch.Tensor: ...


def get_attention_backend(name: str) -> AttentionBackend:
    if name == "torch":
        from shard.platforms.cpu.attention import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        # Imported on demand: triton is only a dependency where this backend is used, and
        # TRITON_INTERPRET must be set before triton is first imported.
        try:
            from shard.platforms.cuda.attention import TritonAttentionBackend
        except ImportError as e:
            raise ValueError(f"attention backend 'triton' needs the triton package: {e}") from e
        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; available: {sorted(BACKENDS)}")


BACKENDS = ("torch", "triton")
