"""The Triton attention backend: the kernels of shard/platforms/cuda/kernels behind the
AttentionBackend interface.

Runs on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1 (slowly; that is how the kernels
are tested without a GPU). Metadata is used exactly as the runner builds it: the packed new keys
share the queries' offsets (cu_seqlens_k = cu_seqlens_q), and context_lens beyond a query's
length means a cached prefix, which the prefill kernel reads through the block table.
"""

from __future__ import annotations

import torch

from shard.attention.metadata import AttentionMetadata
from shard.platforms.cuda.kernels import interpreting
from shard.platforms.cuda.kernels.decode import paged_decode
from shard.platforms.cuda.kernels.kv_write import kv_write
from shard.platforms.cuda.kernels.prefill import varlen_prefill


class TritonAttentionBackend:
    def __init__(self) -> None:
        # Fail at startup rather than at the first kernel launch deep inside Warmup.
        if not interpreting() and not torch.cuda.is_available():
            raise ValueError(
                "attention backend 'triton' needs a CUDA GPU; on CPU it only runs under "
                "TRITON_INTERPRET=1 (slow, for tests) -- use --attention torch"
            )

    def store_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        kv_write(key, value, kv_cache, slot_mapping)

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
        assert meta.cu_seqlens_q is not None, "prefill needs cu_seqlens_q"
        return varlen_prefill(
            q, k, v,
            meta.cu_seqlens_q, meta.cu_seqlens_q, meta.max_seqlen_q, scale,
            kv_cache=kv_cache, block_tables=meta.block_tables, context_lens=meta.context_lens,
            window=window, softcap=softcap, sinks=sinks, chunk=chunk, alibi=alibi,
        )  # fmt: skip

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
        return paged_decode(
            q, kv_cache, meta.block_tables, meta.context_lens, scale,
            window=window, softcap=softcap, sinks=sinks, chunk=chunk, alibi=alibi,
            split_per_sequence=meta.captured,
        )  # fmt: skip
