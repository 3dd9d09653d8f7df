"""What one forward pass tells attention about its tokens: where each new token's K/V goes in
the paged cache, each sequence's block table and context length, and for prefill the packed
query offsets. Built by the runner (shard/step_inputs.py) once per step, read by every layer.

The KV cache of a layer is [2, num_blocks, block_size, Hkv, D]; flattening the block and offset
dims gives one row per slot (`slot = block * block_size + offset`), which is how new tokens are
written and how a block table turns positions into rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    is_prefill: bool
    slot_mapping: torch.Tensor  # [T] int64, cache slot of each new token (T = tokens this step)
    block_tables: torch.Tensor  # [B, max_blocks] int32, rows padded with 0
    context_lens: torch.Tensor  # [B] int32, tokens of each sequence in the cache after this step
    cu_seqlens_q: torch.Tensor | None = None  # prefill: [B+1] int32, packed query offsets
    max_seqlen_q: int = 0  # prefill: longest query
    max_seqlen_k: int = 0  # prefill: longest context (== max_seqlen_q without cached prefix)
    # [B] int32, each row's known length: for a row in its prompt the whole prompt, even while
    # it is computed in chunks (longrope picks its tables by it, shard/layers/rotary.py). None:
    # context_lens for prefill, position + 1 for decode (what every row at its last token has).
    seq_lens: torch.Tensor | None = None
    # Decode captured in a CUDA graph (shard/platforms/cuda/graphs.py): the tensors are the graph's
    # static buffers, whose values change from replay to replay, so no backend may read them on the
    # host or size anything from them; only their shapes (bucket x widest block table) hold.
    captured: bool = False
    # Linear-attention layers (shard/models/linear_attention.py) keep a state per sequence
    # instead of K/V: [B] int64 each sequence's state slot; for a prompt chunk, on the host, each
    # sequence's query length and whether it starts there (else it continues from its slot).
    state_slots: torch.Tensor | None = None
    host_query_lens: tuple[int, ...] = ()
    host_fresh: tuple[bool, ...] = ()
    # What a backend derives from the metadata once per step and every layer reuses (the torch
    # decode path's gather index, by window). The metadata lives for one step, so does this.
    derived: dict[object, object] = field(default_factory=dict, repr=False, compare=False)


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
    # What layers derive from the whole step once and reuse (as AttentionMetadata.derived)
    derived: dict[object, object] = field(default_factory=dict, repr=False, compare=False)


# What a model's forward pass takes: a pure prefill or decode step, or a mixed one.
StepMetadata = AttentionMetadata | MixedMetadata


def prompt_token_rows(meta: AttentionMetadata, num_tokens: int) -> torch.Tensor:
    """[T] the row (sequence) of each of a prefill part's packed tokens: token t is in row r
    where cu_seqlens_q[r] <= t < cu_seqlens_q[r + 1]."""
    cu = meta.cu_seqlens_q
    if cu is None:
        raise ValueError("prefill metadata without cu_seqlens_q: its tokens' rows are unknown")
    tokens = torch.arange(num_tokens, dtype=cu.dtype, device=cu.device)
    return torch.searchsorted(cu[1:], tokens, right=True)
