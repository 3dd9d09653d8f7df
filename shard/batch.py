"""Per-batch state on a shard: what each request holds and the tensors a step reads.

Everything a step needs is kept as padded [B, ...] tensors so that building the model inputs is
a handful of gathers, not a Python loop over requests. `filter` and `concat` keep those tensors
in step with the list of requests.

What the host plans a step from lives on the host (the lengths, the KV slots, the adapters'
slots): it changes in ways the host knows without asking the device (one more cached position,
one more token per sampled row), so a step starts without reading the device
(shard/step_inputs.py). What the device computes with lives there: the token history (the
sampler writes each new token into it), the block tables, the sampling parameters.

A row is decoding when all but its last known token have KV in the cache
(cache_lens == history_lens - 1); before that it is still in its prompt, which chunked prefill
computes over several steps.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from shard.ragged import cat_padded, pad_rows
from shard.requests import NewRequest, Tokens
from shard.sampling.sampler import SamplingTensors


def _cat_slots(slots: list[torch.Tensor | None]) -> torch.Tensor | None:
    if all(s is None for s in slots):
        return None
    if any(s is None for s in slots):
        raise ValueError("batches with and without recurrent state slots cannot be joined")
    return torch.cat(slots)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RequestInfo:
    """The per-request facts that never change while the request lives on the shard."""

    id: int
    input_len: int
    prefill_logprobs: bool
    top_n_tokens: int
    num_blocks: int
    # Positions the router reserved KV slots for (prompt + max_new_tokens).
    capacity: int
    # Structured output: each token it samples must be one its step's token mask allows.
    constrained: bool = False


def _pad_rows(
    rows: Sequence[Sequence[int]], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    return pad_rows(rows, dtype, min_width=1).to(device)


def _check_prefix(r: NewRequest) -> None:
    """A cached prefix the shard could not honour would silently skip computing tokens."""
    if r.prefix_len >= max(len(r.input_ids), 1):
        raise ValueError(
            f"request {r.id}: prefix_len {r.prefix_len} must be less than the prompt length "
            f"{len(r.input_ids)} (the last prompt token is always computed)"
        )
    if r.prefix_len and r.prefill_logprobs:
        raise ValueError(f"request {r.id}: prompt logprobs need the whole prompt computed")


@dataclass
class PromptScores:
    """What a request asking for its prompt's logprobs has gathered so far, position by
    position: each prompt token's logprob and, with top_n_tokens, the alternatives there."""

    logprobs: list[float] = field(default_factory=list)
    top: list[Tokens] = field(default_factory=list)


@dataclass
class Batch:
    id: int
    requests: list[RequestInfo]
    # On the device:
    block_tables: torch.Tensor  # [B, max_blocks] int32
    history: torch.Tensor  # [B, max_positions + 1] int64: prompt + generated ids
    sampling: SamplingTensors
    # On the host:
    slots: torch.Tensor  # [B, max_positions] int64: slots[i, p] = KV slot of position p
    history_lens: torch.Tensor  # [B] int64: valid entries of `history`
    # [B] int64: each request's prompt length (RequestInfo.input_len), for the steps' gathers
    # (shard/step_inputs.py: a longrope row recomputed when its sequence crosses the boundary).
    input_lens: torch.Tensor
    cache_lens: torch.Tensor  # [B] int64: leading positions whose K/V are in the cache
    # [B] int32: the device slot of each request's LoRA adapter, -1 for the base model
    # (shard/lora/manager.py assigns them when the batch arrives).
    lora_slots: torch.Tensor
    # Prompt logprobs gathered chunk by chunk, by request id, until the prompt is complete.
    prompt_logprobs: dict[int, PromptScores] = field(default_factory=dict)
    # Speculative decoding with a draft model (shard/draft.py), on the host: [B] int64 leading
    # positions whose K/V are in the draft's cache (set by `start`), and the last draft
    # phase's guesses by request id, with the history length they follow.
    draft_lens: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    guesses: dict[int, tuple[int, list[int]]] = field(default_factory=dict)
    # [B] int64 on the host: each request's slot in the recurrent state pools of a model with
    # linear attention (shard/models/linear_attention.py), None for a model without. `start`
    # gives rows 0..B-1; the servicer assigns slots no live batch holds (shard/state_slots.py).
    state_slots: torch.Tensor | None = None

    @classmethod
    def start(
        cls, batch_id: int, new: list[NewRequest], device: torch.device, recurrent: bool = False
    ) -> "Batch":
        """The state of a new batch of requests, none of them computed yet (but for a cached
        prefix)."""
        requests = []
        for r in new:
            if len(r.slots) < len(r.input_ids):
                raise ValueError(
                    f"request {r.id}: {len(r.slots)} KV slots for {len(r.input_ids)} prompt tokens"
                )
            _check_prefix(r)
            if recurrent and r.prefix_len:
                raise ValueError(
                    f"request {r.id}: a cached prefix cannot start a model with linear attention "
                    "(its per-sequence state is not in the KV blocks)"
                )
            requests.append(
                RequestInfo(
                    id=r.id,
                    input_len=len(r.input_ids),
                    prefill_logprobs=r.prefill_logprobs,
                    top_n_tokens=r.top_n_tokens,
                    num_blocks=len(r.blocks),
                    capacity=len(r.slots),
                    constrained=r.constrained,
                )
            )
        # History holds one more id than there are slots: the last sampled token never needs KV.
        width = max(len(r.slots) for r in new) + 1
        history = pad_rows([r.input_ids for r in new], torch.int64, min_width=width)
        return cls(
            id=batch_id,
            requests=requests,
            block_tables=_pad_rows([r.blocks for r in new], torch.int32, device),
            history=history.to(device),
            sampling=SamplingTensors.from_params(
                [r.sampling for r in new], [len(r.input_ids) for r in new], device
            ),
            slots=pad_rows([r.slots for r in new], torch.int64, min_width=1),
            history_lens=torch.tensor([len(r.input_ids) for r in new]),
            input_lens=torch.tensor([len(r.input_ids) for r in new]),
            # A cached prefix (router/prefix_cache.py) is already in the request's blocks.
            cache_lens=torch.tensor([r.prefix_len for r in new], dtype=torch.int64),
            lora_slots=torch.full((len(new),), -1, dtype=torch.int32),
            # A cached prefix holds the draft's K/V too: prompt blocks always do (shard/draft.py).
            draft_lens=torch.tensor([r.prefix_len for r in new], dtype=torch.int64),
            state_slots=torch.arange(len(new)) if recurrent else None,
        )

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def max_top_n(self) -> int:
        return max((r.top_n_tokens for r in self.requests), default=0)

    @property
    def max_tokens(self) -> int:
        return sum(r.capacity for r in self.requests)

    def rows(self, request_ids: list[int]) -> list[int]:
        """The rows of these requests, in their order."""
        position = {r.id: i for i, r in enumerate(self.requests)}
        missing = [rid for rid in request_ids if rid not in position]
        if missing:
            raise ValueError(f"batch {self.id} has no requests {missing}")
        return [position[rid] for rid in request_ids]

    def filter(self, request_ids: list[int]) -> "Batch":
        keep_list = self.rows(request_ids)
        keep = torch.tensor(keep_list, dtype=torch.int64)
        on_device = keep.to(self.history.device)
        kept_ids = set(request_ids)
        return Batch(
            id=self.id,
            requests=[self.requests[i] for i in keep_list],
            block_tables=self.block_tables[on_device],
            history=self.history[on_device],
            sampling=self.sampling.index(keep),
            slots=self.slots[keep],
            history_lens=self.history_lens[keep],
            input_lens=self.input_lens[keep],
            cache_lens=self.cache_lens[keep],
            lora_slots=self.lora_slots[keep],
            prompt_logprobs={
                rid: lps for rid, lps in self.prompt_logprobs.items() if rid in kept_ids
            },
            draft_lens=self.draft_lens[keep],
            guesses={rid: g for rid, g in self.guesses.items() if rid in kept_ids},
            state_slots=None if self.state_slots is None else self.state_slots[keep],
        )

    @classmethod
    def concat(cls, batches: list["Batch"]) -> "Batch":
        if len(batches) == 1:
            return batches[0]
        ids = [r.id for b in batches for r in b.requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"batches {[b.id for b in batches]} share request ids")
        return cls(
            id=batches[0].id,
            requests=[r for b in batches for r in b.requests],
            block_tables=cat_padded([b.block_tables for b in batches]),
            history=cat_padded([b.history for b in batches]),
            sampling=SamplingTensors.concat([b.sampling for b in batches]),
            slots=cat_padded([b.slots for b in batches]),
            history_lens=torch.cat([b.history_lens for b in batches]),
            input_lens=torch.cat([b.input_lens for b in batches]),
            cache_lens=torch.cat([b.cache_lens for b in batches]),
            lora_slots=torch.cat([b.lora_slots for b in batches]),
            prompt_logprobs={k: v for b in batches for k, v in b.prompt_logprobs.items()},
            draft_lens=torch.cat([b.draft_lens for b in batches]),
            guesses={k: v for b in batches for k, v in b.guesses.items()},
            state_slots=_cat_slots([b.state_slots for b in batches]),
        )
