"""DeepSeek Sparse Attention over the paged cache (DeepSeek-V3.2, GLM-5): which earlier tokens
each query token reads, as its layer's indexer scores them (the attention over those is the
backends' decode kernel: shard/models/sparse_attention.py `chosen_rows`).

The choice runs in torch on every platform and reads the step's metadata on the device only
(no host read, static shapes for a given block-table width), so a decode step with it can be
captured in a CUDA graph. A query token at position p considers the positions 0..p of its sequence,
through its sequence's block table: the columns a table has past p (stale entries of a reused
row or a graph's padding included) are masked, never read as context.

Work is split into chunks of query tokens so that the gathered keys and the score rows of a
long prompt stay within `CHUNK_BYTES`, whatever its length.
"""

from __future__ import annotations

import torch

from shard.attention.metadata import AttentionMetadata, StepMetadata, prompt_token_rows

# Bytes of gathered indexer keys and float32 scores one chunk of query tokens may take.
CHUNK_BYTES = 256 * 2**20


def token_tables(meta: StepMetadata, num_tokens: int) -> torch.Tensor:
    """[T, W] each token's row of the block tables (prompt tokens: their sequence's; decode
    tokens: their own row's), the widths of a mixed step's two parts padded to the wider."""
    if isinstance(meta, AttentionMetadata):
        return _part_tables(meta, num_tokens)
    parts = []
    if meta.prefill is not None:
        parts.append(_part_tables(meta.prefill, meta.num_prefill_tokens))
    if meta.decode is not None:
        parts.append(_part_tables(meta.decode, num_tokens - meta.num_prefill_tokens))
    width = max(p.shape[1] for p in parts)
    padded = [torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts]
    return padded[0] if len(padded) == 1 else torch.cat(padded)


def _part_tables(meta: AttentionMetadata, num_tokens: int) -> torch.Tensor:
    if not meta.is_prefill:  # one token a row
        return meta.block_tables
    return meta.block_tables[prompt_token_rows(meta, num_tokens)]


def context_slots(tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """[T, W * block_size] int64: the cache slot of each position 0.. of each token's sequence."""
    offsets = torch.arange(block_size, dtype=torch.int64, device=tables.device)
    return (tables.long()[:, :, None] * block_size + offsets).flatten(1)


def _chunk(num_tokens: int, bytes_per_token: int) -> int:
    return max(1, min(num_tokens, CHUNK_BYTES // max(1, bytes_per_token)))


def select_tokens(
    queries: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    top_k: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The indexer's choice: each token's `top_k` best-scored positions among 0..p.

    queries [T, Hi, Di] and weights [T, Hi] (float32, the head weights); keys [S, Di], every
    cache slot's indexer key; slots [T, L] each token's context slots (context_slots); positions
    [T]. The score of position j for token t is sum_h weights[t, h] * relu(scale * q[t, h] . k_j),
    in float32 as transformers computes it. Returns ([T, K] the chosen slots, best first, [T, K]
    whether each is a real position: False for the places a context shorter than K leaves,
    which come last), K = min(top_k, L); which of equally-scored positions is chosen is
    topk's."""
    num_tokens, length = slots.shape
    k = min(top_k, length)
    chosen = torch.empty(num_tokens, k, dtype=torch.int64, device=slots.device)
    valid = torch.empty(num_tokens, k, dtype=torch.bool, device=slots.device)
    per_token = length * (keys.shape[1] * keys.element_size() + 4 * (queries.shape[1] + 1))
    step = _chunk(num_tokens, per_token)
    span = torch.arange(length, device=slots.device)
    for start in range(0, num_tokens, step):
        end = min(start + step, num_tokens)
        context = slots[start:end]
        gathered = keys[context].float()  # [t, L, Di]
        scores = torch.relu(torch.bmm(queries[start:end].float(), gathered.transpose(1, 2)) * scale)
        index = torch.bmm(weights[start:end, None], scores).squeeze(1)  # [t, L]
        later = span[None, :] > positions[start:end, None]
        index = index.masked_fill(later, float("-inf"))
        best, picked = index.topk(k, dim=1, sorted=True)  # the valid ones first
        chosen[start:end] = context.gather(1, picked)
        valid[start:end] = best > float("-inf")
    return chosen, valid
