"""What a shard's compute takes and gives, as plain typed data: the requests joining a batch and
the tokens a step produces. Only the servicer (shard/server.py) knows the wire: it turns
protobuf messages into these and these back into protobuf; the batch state and the runner never
see a protobuf message (as nano-vllm's ModelRunner knows no transport)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shard.sampling.params import SamplingParams


@dataclass(frozen=True)
class NewRequest:
    """A request joining a batch, as the router admitted it."""

    id: int
    input_ids: Sequence[int]
    blocks: Sequence[int]  # its KV block table
    slots: Sequence[int]  # slots[p]: the KV cache slot of position p (prompt + max_new_tokens)
    sampling: SamplingParams
    prefix_len: int = 0  # leading prompt positions whose K/V the cache already holds
    prefill_logprobs: bool = False
    top_n_tokens: int = 0
    adapter_id: str = ""  # "" for the base model
    constrained: bool = False  # structured output: samples only what its token masks allow


@dataclass(frozen=True)
class Tokens:
    ids: list[int]
    logprobs: list[float]


@dataclass(frozen=True)
class Generation:
    """One request's token from one step, with what it asked to see alongside."""

    request_id: int
    # The sampled token (one id, its logprob); with speculative decoding, the tokens the step
    # verified and the one after them (shard/speculation.py).
    token: Tokens
    top_tokens: list[Tokens] | None = None  # per token: the top_n_tokens most likely, when asked
    prefill_tokens: Tokens | None = None  # the prompt and its logprobs, with the first token
    # With prefill_tokens and top_n_tokens: each prompt position's alternatives (first empty).
    prefill_top: list[Tokens] | None = None
    # The draft model's guesses of the tokens after this one (shard/draft.py), when asked.
    draft_ids: list[int] | None = None
