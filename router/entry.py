"""One request's life inside the router: its reservation, its stream of events, its results.

The scheduler is the only writer of an entry's generation state; the HTTP handler only reads
events from `events` and may mark the entry cancelled (client gone), which the scheduler
honours at its next step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from router.block_allocator import Allocation
from router.detokenizer import IncrementalDetokenizer
from router.errors import RouterError
from router.request import ValidRequest
from router.stopping import FinishReason, StoppingCriteria
from router.structured import TokenConstraint
from switchyard_pb import generate_pb2 as pb


@dataclass(frozen=True)
class Token:
    id: int
    text: str  # TGI's token text: a special token's own text too
    logprob: float | None  # None where it cannot be known (first prompt token)
    special: bool = False
    # A generated token's part of the generated text: `text`, or for a special token nothing
    # (or text held back before it, flushed at the end), so the stream adds up to the text.
    content: str = ""


@dataclass(frozen=True)
class Finished:
    generated_text: str
    finish_reason: FinishReason
    # The EOS token or a stop sequence ended the text, also on the last allowed token (where
    # TGI's finish_reason is "length"): OpenAI's finish_reason is then "stop".
    stopped: bool
    generated_tokens: int
    seed: int | None  # only when sampling, as TGI reports it


@dataclass(frozen=True)
class TokenEvent:
    """One generated token; `end` is set on the last one."""

    token: Token
    top_tokens: tuple[Token, ...] = ()
    end: Finished | None = None


@dataclass(frozen=True)
class ErrorEvent:
    error: RouterError


Event = TokenEvent | ErrorEvent


@dataclass(eq=False)
class Entry:
    id: int
    request: ValidRequest
    detokenizer: IncrementalDetokenizer
    stopping: StoppingCriteria
    # The HTTP request's id (router/request_ids.py): in its error bodies and in log lines about it.
    request_id: str = ""
    # Probe of the client connection; the scheduler drops the entry when it returns False.
    alive: Callable[[], bool] = lambda: True
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    allocation: Allocation | None = None
    # Timeline (time.monotonic): the HTTP request arrived, it entered the queue, it was admitted
    # (prefilled), its latest token. They feed the timing headers and the latency histograms.
    received_at: float = field(default_factory=time.monotonic)
    queued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    last_token_at: float | None = None
    prefill: list[Token] = field(default_factory=list)
    # With `prefill` and top_n_tokens: each prompt position's alternatives (OpenAI's echo).
    prefill_top: list[tuple[Token, ...]] = field(default_factory=list)
    tokens: list[Token] = field(default_factory=list)
    top_tokens: list[tuple[Token, ...]] = field(default_factory=list)
    generated_ids: list[int] = field(default_factory=list)
    # Prompt tokens the shards have computed (chunked prefill spreads a prompt over steps).
    prompt_done: int = 0
    # Prompt tokens read from the prefix cache at admission (reported in headers and usage).
    cached_tokens: int = 0
    # Structured output: where the request is in its grammar (router/structured.py).
    constraint: TokenConstraint | None = None
    # Speculative decoding (router/speculation/): tokens proposed for this request over its
    # steps, and how many of them the shards accepted.
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    cancelled: bool = False
    done: bool = False

    def cancel(self) -> None:
        """Called from the HTTP side: the client no longer wants the result."""
        self.cancelled = True

    @property
    def gone(self) -> bool:
        if self.cancelled:
            return True
        try:
            return not self.alive()
        except Exception:  # a broken probe must not break the scheduler
            return True

    @property
    def computed_len(self) -> int:
        """Positions whose K/V the shards hold after a step that ran this request, read before
        the step's result is applied: the prompt done so far, or once it decodes, the prompt and
        every generated token (the one fed this step included; the one it samples next has no
        K/V yet)."""
        if not self.generated_ids:
            return self.prompt_done
        return self.request.input_length + len(self.generated_ids)

    def known_tokens(self) -> list[int]:
        return [*self.request.input_ids, *self.generated_ids]

    @property
    def prompt_left(self) -> int:
        return self.request.input_length - self.prompt_done

    def fail(self, error: RouterError) -> None:
        if not self.done:
            self.done = True
            self.events.put_nowait(ErrorEvent(error))

    def to_proto(self) -> pb.Request:
        assert self.allocation is not None, "a request is sent to shards only once admitted"
        req = self.request
        return pb.Request(
            id=self.id,
            input_ids=req.input_ids,
            parameters=pb.NextTokenChooserParameters(
                **{**asdict(req.sampling), "logit_bias": dict(req.sampling.logit_bias)}
            ),
            stopping_parameters=pb.StoppingCriteriaParameters(
                max_new_tokens=req.max_new_tokens, ignore_eos_token=req.ignore_eos
            ),
            prefill_logprobs=req.decoder_input_details,
            top_n_tokens=req.top_n_tokens,
            adapter_id=req.adapter_id,
            blocks=self.allocation.blocks,
            slots=self.allocation.slots,
            prefix_len=self.allocation.cached_tokens,
            constrained=self.constraint is not None,
        )
