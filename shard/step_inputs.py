"""Which tokens each row of a batch runs in one step, packed into model inputs.

A step runs, for every row, the tokens from its cache length on: one for a decoding row, a
prompt chunk for a row still in its prompt (chunked prefill), or nothing for a prompt row the
router left waiting. Rows that run more than one token form the prefill part (varlen attention,
earlier chunks read from the cache); rows that run exactly one form the decode part (paged
attention). The packed token order is the prefill part, then the decode part.

Longrope (Phi-3, Phi-3.5, Phi-4-mini) rotates a sequence's tokens with its short tables while
the sequence is at most B = original_max_position_embeddings long and with the long ones past
it. A row whose prompt is at most B long and that runs its token at position B (B positions
cached, sequence B + 1) is recomputed whole in that step instead: a prefill row of its history
from position 0 (`step_starts`), so every K/V it holds is rewritten with the long tables, as
transformers' Phi3ForCausalLM.prepare_inputs_for_generation drops its cache there. It then
samples as any decoding row does. The router keeps such requests' blocks private
(router/prefix_cache.py), since this rewrites them in place.

Built from gathers on the batch's padded tensors: no Python loop over requests or tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from shard.attention import AttentionMetadata, MixedMetadata, StepMetadata
from shard.batch import Batch


@dataclass(frozen=True)
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: StepMetadata
    token_rows: torch.Tensor  # [T] batch row of each packed token
    # Rows that run their last known token, so a new one is sampled for them (ascending), and
    # the packed index of that last token.
    sample_rows: torch.Tensor  # [S]
    sample_index: torch.Tensor  # [S]


def step_starts(batch: Batch, rope_regime_boundary: int = 0) -> torch.Tensor:
    """[B] the first position each row runs this step: its cache length, but 0 for a row that
    crosses the longrope boundary now (`rope_regime_boundary`, the model config's; 0: none):
    its prompt is at most that long and it runs its token at that position."""
    if rope_regime_boundary <= 0:
        return batch.cache_lens
    crossing = (
        (batch.input_lens <= rope_regime_boundary)
        & (batch.cache_lens == rope_regime_boundary)
        & (batch.history_lens == rope_regime_boundary + 1)
    )
    return torch.where(crossing, 0, batch.cache_lens)


def step_lengths(
    batch: Batch, chunks: Mapping[int, int], starts: torch.Tensor | None = None
) -> torch.Tensor:
    """[B] tokens each row runs: 1 when decoding, its chunk (default: the rest) in its prompt,
    all its known tokens from its start (`step_starts`, default its cache length) when that is
    earlier (the longrope crossing)."""
    starts = batch.cache_lens if starts is None else starts
    remaining = batch.history_lens - starts
    if not chunks:
        return remaining
    ids = [r.id for r in batch.requests]
    unknown = set(chunks) - set(ids)
    if unknown:
        raise ValueError(f"prefill_chunks name requests {sorted(unknown)} not in batch {batch.id}")
    asked = torch.tensor([chunks.get(i, -1) for i in ids], device=remaining.device)
    # In its prompt by the cache, not by the start: a recomputed row is decoding, runs whole
    # and samples, whatever chunk it might be named with.
    in_prompt = (batch.history_lens - batch.cache_lens > 1) & (asked >= 0)
    return torch.where(in_prompt, torch.minimum(asked, remaining), remaining)


def build_step_inputs(
    batch: Batch, q_lens: torch.Tensor, starts: torch.Tensor | None = None
) -> StepInputs:
    """The packed inputs of a step where each row runs q_lens tokens from `starts` (its
    cache length unless `step_starts` said otherwise)."""
    device = q_lens.device
    starts = batch.cache_lens if starts is None else starts
    rows_p = (q_lens > 1).nonzero().squeeze(1)
    rows_d = (q_lens == 1).nonzero().squeeze(1)
    last = torch.full_like(q_lens, -1)
    ids, positions, slots, token_rows = [], [], [], []

    prefill = None
    num_prefill_tokens = 0
    if len(rows_p):
        lens = q_lens[rows_p]
        start = starts[rows_p]
        width = int(lens.max())
        columns = torch.arange(width, device=device)
        # Row-major boolean indexing packs the chunks one after another: the varlen layout.
        mask = columns[None, :] < lens[:, None]
        pos = start[:, None] + columns[None, :]
        history = batch.history[rows_p]
        row_slots = batch.slots[rows_p]
        # Padded columns may point past a row's end; clamp to gather, then the mask drops them.
        ids.append(history.gather(1, pos.clamp(max=history.shape[1] - 1))[mask])
        slots.append(row_slots.gather(1, pos.clamp(max=row_slots.shape[1] - 1))[mask])
        positions.append(pos[mask])
        token_rows.append(rows_p[:, None].expand(-1, width)[mask])
        cu_seqlens = torch.zeros(len(rows_p) + 1, dtype=torch.int32, device=device)
        cu_seqlens[1:] = torch.cumsum(lens, 0)
        context = start + lens
        prefill = AttentionMetadata(
            is_prefill=True,
            slot_mapping=slots[-1],
            block_tables=batch.block_tables[rows_p],
            context_lens=context.to(torch.int32),
            cu_seqlens_q=cu_seqlens,
            max_seqlen_q=width,
            max_seqlen_k=int(context.max()),
            # The whole prompt, not the context after this chunk: a chunked prompt's rotary
            # (longrope) is the one the prompt computed at once has.
            seq_lens=batch.history_lens[rows_p].to(torch.int32),
        )
        num_prefill_tokens = int(cu_seqlens[-1])
        last[rows_p] = cu_seqlens[1:].to(last.dtype) - 1

    decode = None
    if len(rows_d):
        everyone = len(rows_d) == len(batch)
        pos_d = starts[rows_d]
        ids.append(batch.history[rows_d, pos_d])
        slots.append(batch.slots[rows_d, pos_d])
        positions.append(pos_d)
        token_rows.append(rows_d)
        decode = AttentionMetadata(
            is_prefill=False,
            slot_mapping=slots[-1],
            block_tables=batch.block_tables if everyone else batch.block_tables[rows_d],
            context_lens=(pos_d + 1).to(torch.int32),
            # position + 1 but for a one-token chunk in the middle of a prompt, which is in the
            # decode part too and must rotate as the rest of its prompt does.
            seq_lens=(batch.history_lens if everyone else batch.history_lens[rows_d]).to(
                torch.int32
            ),
        )
        last[rows_d] = num_prefill_tokens + torch.arange(len(rows_d), device=device)

    if decode is None or prefill is None:
        meta: StepMetadata = decode if prefill is None else prefill  # type: ignore[assignment]
    else:
        meta = MixedMetadata(
            slot_mapping=_cat(slots),
            prefill=prefill,
            decode=decode,
            num_prefill_tokens=num_prefill_tokens,
        )
    sample_rows = ((q_lens > 0) & (starts + q_lens == batch.history_lens)).nonzero()
    sample_rows = sample_rows.squeeze(1)
    return StepInputs(
        input_ids=_cat(ids),
        positions=_cat(positions),
        meta=meta,
        token_rows=_cat(token_rows),
        sample_rows=sample_rows,
        sample_index=last[sample_rows],
    )


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)
