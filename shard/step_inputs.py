"""Which tokens each row of a batch runs in one step, packed into model inputs.

A step runs, for every row, the tokens from its cache length on: one for a decoding row, a
prompt chunk for a row still in its prompt (chunked prefill), or nothing for a prompt row the
router left waiting. Rows that run more than one token form the prefill part (varlen attention,
earlier chunks read from the cache); rows that run exactly one form the decode part (paged
attention). The packed token order is the prefill part, then the decode part.

A decoding row verifying k proposed tokens (speculative decoding, shard/speculation.py) runs
k + 1 tokens as k + 1 rows of the decode part, and samples at each.

Longrope (Phi-3, Phi-3.5, Phi-4-mini) rotates a sequence's tokens with its short tables while
the sequence is at most B = original_max_position_embeddings long and with the long ones past
it. A row whose prompt is at most B long and that runs its token at position B (B positions
cached, sequence B + 1) is recomputed whole in that step instead: a prefill row of its history
from position 0 (`step_starts`), so every K/V it holds is rewritten with the long tables, as
transformers' Phi3ForCausalLM.prepare_inputs_for_generation drops its cache there. It then
samples as any decoding row does. The router keeps such requests' blocks private
(router/prefix_cache.py), since this rewrites them in place.

Planned on the host, from the lengths the batch keeps there (shard/batch.py), with gathers on
its padded tensors and no Python loop over requests or tokens; every index and length the
device needs goes in one host buffer (pinned where the platform pins) and reaches the device in
one copy, queued without waiting (`Platform.upload`). The token ids themselves are gathered on
the device from the batch's device history, which the step before wrote its sampled tokens
into: nothing of the device is read to start a step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from shard.attention import AttentionMetadata, MixedMetadata, StepMetadata
from shard.batch import Batch
from shard.platforms import platform_of


@dataclass(frozen=True)
class HostStep:
    """What the host knows of a step without asking the device: for the work around it (the
    answers, the prompt logprobs, the tokens' adapters)."""

    token_rows: torch.Tensor  # [T] batch row of each packed token
    positions: torch.Tensor  # [T]
    sample_rows: torch.Tensor  # [S] ascending
    # [S] proposed tokens each sample follows (0 for a row's first; speculative decoding), None
    # in a step without proposals.
    sample_offsets: torch.Tensor | None = None


@dataclass(frozen=True)
class StepInputs:
    """The step's model inputs on the device."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: StepMetadata
    token_rows: torch.Tensor  # [T] batch row of each packed token
    # Rows that run their last known token, so a new one is sampled for them (ascending), the
    # packed index of that last token, and how many tokens each knows: where its new token goes
    # in the history, and the step number of its random draw.
    sample_rows: torch.Tensor  # [S]
    sample_index: torch.Tensor  # [S]
    sample_lens: torch.Tensor  # [S]
    # [T] int32 the LoRA slot of each token (-1: the base model); None when no token of the
    # step uses an adapter.
    token_lora_slots: torch.Tensor | None
    host: HostStep


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
    asked = torch.tensor([chunks.get(i, -1) for i in ids])
    # In its prompt by the cache, not by the start: a recomputed row is decoding, runs whole
    # and samples, whatever chunk it might be named with.
    in_prompt = (batch.history_lens - batch.cache_lens > 1) & (asked >= 0)
    return torch.where(in_prompt, torch.minimum(asked, remaining), remaining)


def build_step_inputs(
    batch: Batch,
    q_lens: torch.Tensor,
    starts: torch.Tensor | None = None,
    device: torch.device | None = None,
    proposed: torch.Tensor | None = None,
) -> StepInputs:
    """The packed inputs of a step where each row runs q_lens tokens from `starts` (its
    cache length unless `step_starts` said otherwise), on `device` (default: the batch's).

    `proposed` [B]: tokens proposed after each row's known ones (speculative decoding,
    shard/speculation.py), already in the device history and counted in q_lens; such a row
    samples at its last known token and after each proposal: it appears in sample_rows once
    per sample, at consecutive packed indices and history lengths."""
    device = batch.history.device if device is None else device
    starts = batch.cache_lens if starts is None else starts
    every_row_decodes = bool(((q_lens == 1) & (batch.history_lens - starts == 1)).all())
    # (a one-token prompt of a linear-attention model starts its state: a prefill row)
    starts_state = batch.state_slots is not None and bool((starts == 0).any())
    if proposed is None and every_row_decodes and not starts_state:
        return _decode_step_inputs(batch, starts, device)
    return _step_inputs(batch, q_lens, starts, device, proposed)


def _decode_step_inputs(batch: Batch, starts: torch.Tensor, device: torch.device) -> StepInputs:
    """`build_step_inputs` of the most common step, where every row runs its one last known
    token and samples after it, in a third of the host's operations: every row is a decode
    row, token, sample and row indices are all 0..B-1, and each row's history length is its
    sequence length. A step's planning is host time before a GPU gets its work, and on the
    critical path whenever the step cannot be queued ahead (speculation, grammars)."""
    rows = torch.arange(len(batch))
    positions = starts.clone()  # the host's own: the batch's lengths move on after launch
    host = HostStep(token_rows=rows, positions=positions, sample_rows=rows)
    lora_slots = batch.lora_slots if bool((batch.lora_slots >= 0).any()) else None
    on_device = upload(
        {
            "rows": rows,
            "positions": positions,
            "slot_mapping": batch.slots.gather(1, positions[:, None]).squeeze(1),
            "decode_context": positions + 1,
            "history_lens": batch.history_lens,
            **({"token_lora_slots": lora_slots} if lora_slots is not None else {}),
            **({"decode_state_slots": batch.state_slots} if batch.state_slots is not None else {}),
        },
        device,
    )
    on_device.update(
        token_rows=on_device["rows"],
        decode_rows=on_device["rows"],
        decode_seq_lens=on_device["history_lens"],
    )
    return StepInputs(
        input_ids=batch.history[on_device["rows"], on_device["positions"]],
        positions=on_device["positions"],
        meta=_metadata(batch, on_device, 0, (0, 0)),
        token_rows=on_device["rows"],
        sample_rows=on_device["rows"],
        sample_index=on_device["rows"],
        sample_lens=on_device["history_lens"],
        token_lora_slots=(
            on_device["token_lora_slots"].to(torch.int32) if lora_slots is not None else None
        ),
        host=host,
    )


def _step_inputs(
    batch: Batch,
    q_lens: torch.Tensor,
    starts: torch.Tensor,
    device: torch.device,
    proposed: torch.Tensor | None,
) -> StepInputs:
    """`build_step_inputs` of any step."""
    # A row verifying proposals runs as one decode row per token (`_decode_rows`).
    verifying = proposed > 0 if proposed is not None else torch.zeros_like(q_lens, dtype=torch.bool)
    # A linear-attention row that starts its sequence with one token is a prefill row: only
    # the prefill path starts a state from zeros (AttentionMetadata.host_fresh).
    single = q_lens == 1
    if batch.state_slots is not None:
        single &= starts > 0
    rows_p = ((q_lens > 0) & ~single & ~verifying).nonzero().squeeze(1)
    rows_d, offsets_d = _decode_rows(single | verifying, proposed)
    last = torch.full_like(q_lens, -1)
    positions, slots, token_rows = [], [], []
    parts: dict[str, torch.Tensor] = {}  # what else the device needs, uploaded with them

    prefill_shape = (0, 0)  # the longest query and context of the prefill part
    num_prefill_tokens = 0
    host_prefill: tuple[tuple[int, ...], tuple[bool, ...]] = ((), ())
    if len(rows_p):
        lens = q_lens[rows_p]
        start = starts[rows_p]
        width = int(lens.max())
        columns = torch.arange(width)
        # Row-major boolean indexing packs the chunks one after another: the varlen layout.
        mask = columns[None, :] < lens[:, None]
        pos = start[:, None] + columns[None, :]
        row_slots = batch.slots[rows_p]
        # Padded columns may point past a row's end; clamp to gather, then the mask drops them.
        slots.append(row_slots.gather(1, pos.clamp(max=row_slots.shape[1] - 1))[mask])
        positions.append(pos[mask])
        token_rows.append(rows_p[:, None].expand(-1, width)[mask])
        cu_seqlens = torch.zeros(len(rows_p) + 1, dtype=torch.int64)
        cu_seqlens[1:] = torch.cumsum(lens, 0)
        context = start + lens
        prefill_shape = (width, int(context.max()))
        num_prefill_tokens = int(cu_seqlens[-1])
        last[rows_p] = cu_seqlens[1:] - 1
        # The whole prompt as seq_lens, not the context after this chunk: a chunked prompt's
        # rotary (longrope) is the one the prompt computed at once has.
        parts.update(
            prefill_rows=rows_p,
            prefill_cu_seqlens=cu_seqlens,
            prefill_context=context,
            prefill_seq_lens=batch.history_lens[rows_p],
        )
        if batch.state_slots is not None:  # linear attention: each chunk's state slot
            parts.update(prefill_state_slots=batch.state_slots[rows_p])
            host_prefill = (tuple(lens.tolist()), tuple((start == 0).tolist()))

    if len(rows_d):
        pos_d = starts[rows_d] + offsets_d
        slots.append(batch.slots[rows_d, pos_d])
        positions.append(pos_d)
        token_rows.append(rows_d)
        # A row's last token (its decode rows are consecutive, in position order).
        last[rows_d] = num_prefill_tokens + torch.arange(len(rows_d))
        # seq_lens: position + 1 but for a one-token chunk in the middle of a prompt, which is
        # in the decode part too and must rotate as the rest of its prompt does.
        parts.update(
            decode_rows=rows_d,
            decode_context=pos_d + 1,
            decode_seq_lens=batch.history_lens[rows_d] + offsets_d,
        )
        if batch.state_slots is not None:
            if proposed is not None:  # the router refuses speculation for these models
                raise ValueError("a model with linear attention cannot verify proposed tokens")
            parts.update(decode_state_slots=batch.state_slots[rows_d])

    known = batch.history_lens if proposed is None else batch.history_lens + proposed
    sample_rows = ((q_lens > 0) & (starts + q_lens == known)).nonzero().squeeze(1)
    sample_index, sample_lens = last[sample_rows], batch.history_lens[sample_rows]
    sample_offsets = None
    if proposed is not None:
        sample_rows, sample_index, sample_lens, sample_offsets = _verified(
            sample_rows, proposed[sample_rows], sample_index, sample_lens
        )
    host = HostStep(
        token_rows=_cat(token_rows),
        positions=_cat(positions),
        sample_rows=sample_rows,
        sample_offsets=sample_offsets,
    )
    # The tokens' adapters, gathered only when a row of the batch has one.
    token_lora_slots = None
    uses_adapters = bool((batch.lora_slots >= 0).any())
    if uses_adapters:
        token_lora_slots = batch.lora_slots[host.token_rows]
        uses_adapters = bool((token_lora_slots >= 0).any())
    on_device = upload(
        {
            "positions": host.positions,
            "slot_mapping": _cat(slots),
            "token_rows": host.token_rows,
            "sample_rows": sample_rows,
            "sample_index": sample_index,
            "sample_lens": sample_lens,
            **parts,
            **({"token_lora_slots": token_lora_slots} if uses_adapters else {}),
        },
        device,
    )
    return StepInputs(
        input_ids=batch.history[on_device["token_rows"], on_device["positions"]],
        positions=on_device["positions"],
        meta=_metadata(
            batch,
            on_device,
            num_prefill_tokens,
            prefill_shape,
            once_per_row=proposed is None,
            host_prefill=host_prefill,
        ),
        token_rows=on_device["token_rows"],
        sample_rows=on_device["sample_rows"],
        sample_index=on_device["sample_index"],
        sample_lens=on_device["sample_lens"],
        token_lora_slots=(on_device["token_lora_slots"].to(torch.int32) if uses_adapters else None),
        host=host,
    )


def _decode_rows(
    decoding: torch.Tensor, proposed: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode part's rows, one per token, and each token's offset from its row's start.

    A row verifying k proposals is k + 1 decode rows over the same block table, the j-th at
    position start + j with a context of start + j + 1: the step stores every new token's K/V
    before any token attends (shard/attention/backend.py), so each one sees the proposals
    before it, as a causal prompt chunk would. As decode rows, verification runs the decode
    kernels, the CPU decode loop and the CUDA decode graphs of a batch of that many rows."""
    rows = decoding.nonzero().squeeze(1)
    if proposed is None:
        return rows, torch.zeros_like(rows)
    return _expand(rows, proposed[rows] + 1)


def _verified(
    rows: torch.Tensor, proposed: torch.Tensor, last: torch.Tensor, lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample rows, packed indices, history lengths and offsets j of rows verifying `proposed`
    tokens each: row r with k proposals samples k + 1 times, at its last k + 1 packed tokens,
    the j-th one as a row of history length lens + j would."""
    counts = proposed + 1
    expanded, j = _expand(rows, counts)
    each = _expand(counts, counts)[0]
    lasts, lens = _expand(last, counts)[0], _expand(lens, counts)[0]
    return expanded, lasts - (each - 1 - j), lens + j, j


def _expand(values: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values[i] repeated counts[i] times, and each repeat's index 0..counts[i] - 1."""
    total = int(counts.sum())
    first = torch.cumsum(counts, 0) - counts
    offsets = torch.arange(total) - first.repeat_interleave(counts, output_size=total)
    return values.repeat_interleave(counts, output_size=total), offsets


def _metadata(
    batch: Batch,
    on_device: Mapping[str, torch.Tensor],
    num_prefill_tokens: int,
    prefill_shape: tuple[int, int],
    once_per_row: bool = True,
    host_prefill: tuple[tuple[int, ...], tuple[bool, ...]] = ((), ()),
) -> StepMetadata:
    """The attention metadata of the step's parts, from their uploaded indices (and for linear
    attention's prompt chunks, their lengths and fresh starts on the host)."""
    slot_mapping = on_device["slot_mapping"]
    prefill = decode = None
    if "prefill_rows" in on_device:
        prefill = AttentionMetadata(
            is_prefill=True,
            slot_mapping=slot_mapping[:num_prefill_tokens],
            block_tables=batch.block_tables[on_device["prefill_rows"]],
            context_lens=on_device["prefill_context"].to(torch.int32),
            cu_seqlens_q=on_device["prefill_cu_seqlens"].to(torch.int32),
            max_seqlen_q=prefill_shape[0],
            max_seqlen_k=prefill_shape[1],
            seq_lens=on_device["prefill_seq_lens"].to(torch.int32),
            state_slots=on_device.get("prefill_state_slots"),
            host_query_lens=host_prefill[0],
            host_fresh=host_prefill[1],
        )
    if "decode_rows" in on_device:
        rows = on_device["decode_rows"]
        # The batch's own tables when every row decodes once, in order.
        everyone = once_per_row and len(rows) == len(batch)
        decode = AttentionMetadata(
            is_prefill=False,
            slot_mapping=slot_mapping[num_prefill_tokens:],
            block_tables=batch.block_tables if everyone else batch.block_tables[rows],
            context_lens=on_device["decode_context"].to(torch.int32),
            seq_lens=on_device["decode_seq_lens"].to(torch.int32),
            state_slots=on_device.get("decode_state_slots"),
        )
    if decode is None or prefill is None:
        return decode if prefill is None else prefill  # type: ignore[return-value]
    return MixedMetadata(
        slot_mapping=slot_mapping,
        prefill=prefill,
        decode=decode,
        num_prefill_tokens=num_prefill_tokens,
    )


def upload(parts: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Host integer tensors on `device` as int64 views of one buffer, copied there at once."""
    platform = platform_of(device)
    sizes = [p.numel() for p in parts.values()]
    buffer = platform.host_buffer(sum(sizes), torch.int64)
    # (no reshape or cast for what is flat int64 already: each is a dispatch of its own)
    flat = [
        p if p.dim() == 1 and p.dtype == torch.int64 else p.reshape(-1).long()
        for p in parts.values()
    ]
    torch.cat(flat, out=buffer)
    on_device = platform.upload(buffer, device)
    return dict(zip(parts, on_device.split(sizes), strict=True))


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)
