"""The logprobs of prompt tokens, for requests that asked for them (TGI's `decoder_input_details`,
OpenAI's `echo` with `logprobs`): position p predicts token p + 1 under the raw distribution.

Three parts, as the step has them (shard/runner.py): which packed tokens score, planned on the
host; their scores, queued on the device beside the step; and, once the step's answers are
back, the scores kept by request until the prompt is complete and its first token goes out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shard.batch import Batch, PromptScores
from shard.requests import Tokens
from shard.step_inputs import HostStep, upload


@dataclass(frozen=True)
class PromptRows:
    """The packed tokens whose next prompt token is scored this step."""

    rows: list[int]  # [N] their batch rows
    top_n: list[int]  # [N] alternatives each row's request wants
    # On the device: the packed token indices, and where each one's next token is in the
    # history (its row, its position + 1).
    index: torch.Tensor
    target_rows: torch.Tensor
    target_positions: torch.Tensor


@dataclass(frozen=True)
class PromptScoresOnDevice:
    logprobs: torch.Tensor  # [N]
    top_ids: torch.Tensor | None  # [N, n]
    top_logprobs: torch.Tensor | None


def plan(batch: Batch, step: HostStep, device: torch.device) -> PromptRows | None:
    """The tokens to score: those of rows still in their prompt whose request asked, but for
    the prompt's last token, which predicts the first generated one."""
    if not any(r.prefill_logprobs for r in batch.requests):
        return None
    wants = torch.tensor([r.prefill_logprobs for r in batch.requests])
    # Only rows still in their prompt: a longrope row recomputed past its boundary
    # (step_starts) runs its prompt again, whose logprobs went out with its first token.
    wants &= batch.history_lens == batch.input_lens
    rows, pos = step.token_rows, step.positions
    index = (wants[rows] & (pos + 1 < batch.input_lens[rows])).nonzero().squeeze(1)
    if not len(index):
        return None
    rows, pos = rows[index], pos[index]
    on_device = upload({"index": index, "rows": rows, "positions": pos + 1}, device)
    rows_list = rows.tolist()
    return PromptRows(
        rows=rows_list,
        top_n=[batch.requests[row].top_n_tokens for row in rows_list],
        index=on_device["index"],
        target_rows=on_device["rows"],
        target_positions=on_device["positions"],
    )


def score(model, hidden: torch.Tensor, batch: Batch, rows: PromptRows) -> PromptScoresOnDevice:
    """The planned tokens' scores, computed on the device without waiting for it."""
    logits = model.compute_logits(hidden[rows.index])
    targets = batch.history[rows.target_rows, rows.target_positions]
    all_logprobs = torch.log_softmax(logits, -1)
    logprobs = all_logprobs.gather(1, targets[:, None]).squeeze(1)
    if not max(rows.top_n):
        return PromptScoresOnDevice(logprobs, None, None)
    # the alternatives too (OpenAI's echo with logprobs)
    top = all_logprobs.topk(min(max(rows.top_n), all_logprobs.shape[-1]), dim=-1)
    return PromptScoresOnDevice(logprobs, top.indices, top.values)


def record(batch: Batch, rows: PromptRows, scores: PromptScoresOnDevice) -> None:
    """Keeps the scores by request, after the step's answers came back."""
    logprobs = scores.logprobs.tolist()
    top_ids = scores.top_ids.tolist() if scores.top_ids is not None else None
    top_lps = scores.top_logprobs.tolist() if scores.top_logprobs is not None else None
    # Tokens are packed row by row in position order, so appending keeps each list in order.
    for i, (row, logprob) in enumerate(zip(rows.rows, logprobs, strict=True)):
        kept = batch.prompt_logprobs.setdefault(batch.requests[row].id, PromptScores())
        kept.logprobs.append(logprob)
        n = rows.top_n[i]
        if n and top_ids is not None and top_lps is not None:
            kept.top.append(Tokens(ids=top_ids[i][:n], logprobs=top_lps[i][:n]))
