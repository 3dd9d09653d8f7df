"""What the generation handlers talk to: validate a request, hold a concurrency permit, submit
it and read its events from the returned Entry. Nothing else of the router (queue, allocator,
batcher, metrics, limits) is reachable from a handler through it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from router.adapters import AdapterRegistry
from router.chat_features import ChatFeatures
from router.detokenizer import IncrementalDetokenizer
from router.entry import Entry
from router.errors import OverloadedError
from router.metrics import Metrics
from router.queue import Queue
from router.request import GenerationRequest, ValidRequest
from router.stopping import StoppingCriteria
from router.tokenizer import Tokenizer
from router.validation import Validator


@dataclass(frozen=True)
class ModelInfo:
    """What answers report about the model, from the shards' Info answer."""

    model_id: str
    dtype: str
    device_type: str
    world_size: int
    eos_token_ids: tuple[int, ...]
    vocab_size: int | None  # the model's logits (None: the shards did not say)
    # Longrope's original_max_position_embeddings, 0 otherwise: prompts longer than it never
    # share cached blocks with shorter ones (router/prefix_cache.py).
    rope_regime_boundary: int = 0


def stop_token_ids(model: ModelInfo, tokenizer: Tokenizer) -> frozenset[int]:
    """The tokens that end a generation: the model's EOS ids, else the tokenizer's."""
    eos = set(model.eos_token_ids)
    if not eos and tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return frozenset(eos)


class ConcurrencyLimit:
    """--max-concurrent-requests: 429 past it, as TGI's semaphore answers."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    @contextmanager
    def permit(self, count: int = 1) -> Iterator[None]:
        """Holds `count` request slots for the life of a request, or raises 429."""
        if self.in_flight + count > self.limit:
            raise OverloadedError()
        self.in_flight += count
        try:
            yield
        finally:
            self.in_flight -= count


class Generations:
    def __init__(
        self,
        model: ModelInfo,
        tokenizer: Tokenizer,
        validator: Validator,
        limit: ConcurrencyLimit,
        queue: Queue,
        adapters: AdapterRegistry,
        metrics: Metrics,
    ) -> None:
        self.model = model  # named in answers (`model`, x-compute-type)
        self.tokenizer = tokenizer  # chat templates, token pieces in logprobs
        self.validator = validator
        self.limit = limit
        self._queue = queue
        self._adapters = adapters
        self._metrics = metrics
        self.eos_token_ids = stop_token_ids(model, tokenizer)
        # Tool-call and reasoning parsers (router/chat_features.py): none unless turned on.
        self.chat = ChatFeatures()
        self._ids = itertools.count(1)

    async def validate(self, request: GenerationRequest) -> ValidRequest:
        return await self.validator.validate(request)

    def permit(self, count: int = 1) -> AbstractContextManager[None]:
        return self.limit.permit(count)

    def submit(
        self,
        request: ValidRequest,
        alive: Callable[[], bool] | None = None,
        received_at: float | None = None,
        request_id: str = "",
    ) -> Entry:
        """Queues a validated request; its events arrive on the returned Entry."""
        # Validation awaits the tokenizer: an unload may have begun since its adapter check.
        # Checked again here, where it enters the queue, so every request an unload must wait
        # for is in the queue or running when the unload looks (router/lora_runtime.py).
        self._adapters.adapter_id(request.adapter_id)
        entry = Entry(
            id=next(self._ids),
            request=request,
            request_id=request_id,
            detokenizer=IncrementalDetokenizer(self.tokenizer, request.input_ids),
            stopping=StoppingCriteria(
                request.max_new_tokens, self.eos_token_ids, request.ignore_eos, request.stop
            ),
            constraint=request.grammar.start() if request.grammar is not None else None,
        )
        if alive is not None:
            entry.alive = alive
        if received_at is not None:
            entry.received_at = received_at
        self._metrics.input_tokens.inc(request.input_length)
        self._metrics.queued(request.adapter_id)
        self._queue.append(entry)
        return entry
