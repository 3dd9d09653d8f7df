"""LoRA adapters on the router side: which exist, what a request's name resolves to, which are
live on the shards, and the admission rule that keeps the shards' device slots sufficient.

The contract with the shards (docs/lora.md): a request carries `adapter_id` ("" = the base
model); the shards map ids to device slots themselves and rely on the router never having more
than `--max-loras` distinct non-empty ids among the requests live on them at once. With chunked
prefill, newly admitted requests run in the same forward pass as the running batch, so "live" is
the running batch plus whatever one step admits: every admitted request until it is released.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from router.errors import ModelNotFoundError, ValidationError
from shard.lora.names import AdapterListError, check_adapter_names, split_adapter_list

BASE = ""  # adapter_id of a base-model request, on the wire and in the router
# The list format and the name rules are shared with the launcher and the shards.
AdapterSpecError = AdapterListError


@dataclass(frozen=True)
class LoraAdapter:
    name: str  # what requests use: TGI's `parameters.adapter_id`, OpenAI's `model`
    path: str  # the directory the shards loaded it from (the launcher resolved hub ids)


def parse_adapters(values: Iterable[str], model_name: str) -> tuple[LoraAdapter, ...]:
    """`NAME=DIR[,NAME=DIR...]`, given once or several times (the launcher's forwarding form)."""
    adapters = tuple(LoraAdapter(name, path) for name, path in split_adapter_list(values))
    check_names([a.name for a in adapters], model_name)
    return adapters


def check_names(names: Sequence[str], model_name: str) -> None:
    check_adapter_names(names, model_name)


class AdapterRegistry:
    """The adapters requests may name: those given at startup, plus those loaded at runtime,
    minus those unloaded (router/lora_runtime.py)."""

    def __init__(
        self, adapters: Sequence[LoraAdapter], model_name: str, *, runtime_loading: bool = False
    ) -> None:
        self.model_name = model_name
        self.runtime_loading = runtime_loading
        self._by_name = {a.name: a for a in adapters}
        # Being unloaded: still on the shards while the requests already queued finish, but a
        # new request naming one is refused like an unknown name.
        self._closing: set[str] = set()

    @property
    def adapters(self) -> tuple[LoraAdapter, ...]:
        """The adapters new requests may use, in the order they were loaded."""
        return tuple(a for name, a in self._by_name.items() if name not in self._closing)

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.adapters]

    def serving(self, name: str) -> bool:
        return name in self._by_name and name not in self._closing

    def on_shards(self, name: str) -> bool:
        """Loaded on the shards, being unloaded included: the name is taken."""
        return name in self._by_name

    def add(self, adapter: LoraAdapter) -> None:
        if adapter.name in self._by_name:
            raise ValueError(f"adapter {adapter.name!r} is already registered")
        self._by_name[adapter.name] = adapter

    def close(self, name: str) -> None:
        """From now on, new requests for `name` are refused; those queued are still served."""
        self._closing.add(name)

    def remove(self, name: str) -> None:
        self._by_name.pop(name, None)
        self._closing.discard(name)

    def adapter_id(self, adapter_id: str) -> str:
        """TGI's `parameters.adapter_id`: a known adapter, or "" (the base model); else a 422.
        Never a silent fallback to the base model: the client asked for other weights."""
        if not adapter_id or self.serving(adapter_id):
            return adapter_id
        if not self.adapters:
            raise ValidationError(
                f"`adapter_id` {adapter_id!r}: no LoRA adapters are loaded on this server"
            )
        raise ValidationError(
            f"`adapter_id` {adapter_id!r} is not a loaded LoRA adapter. "
            f"Loaded: {', '.join(self.names)}"
        )

    def model(self, model: str | None) -> str:
        """OpenAI's `model`: an adapter's name selects it, the served name the base model.

        Anything else is a 404 `model_not_found`, as OpenAI and vLLM answer, adapters or not: a
        typo in an adapter's name must not run the base model instead, and a client that names
        a model this server does not serve must learn so rather than get another model's
        answer. (The served name is `--served-model-name`, which the launcher sets to the
        `--model-id` it was given when no other name is chosen.)
        """
        if model is not None and self.serving(model):
            return model
        if model is None or model == self.model_name:
            return BASE
        raise ModelNotFoundError(model, [self.model_name, *self.names])


class AdmissionGate:
    """One admission round's view of the adapters: those live, plus those it has let in.

    The queue asks it about each waiting request in arrival order. When a request's adapter
    finds every slot taken, that request is skipped, not a wall: the base model's requests and
    those of live adapters go on being admitted behind it (vLLM's scheduler skips such requests
    too), so one request for a cold adapter does not stall the whole server. What keeps it from
    starving is the drain: one live adapter, the one with the fewest requests on the shards,
    admits no request that arrived after the skipped one, so its slot frees up once its
    requests end (each is bounded by its max_new_tokens), and the oldest skipped request,
    first in the queue, takes it. Slots are thus handed out first come, first served.
    """

    def __init__(self, live: LiveAdapters) -> None:
        self._live = live
        self._adapters = set(live.live())
        self._max = live.max_loras
        self._skipped = False  # a request of this round found no slot

    def admit(self, adapter_id: str) -> bool:
        """Whether a request for this adapter may join; a True counts it for the rest of the round.

        The base model uses no slot; an adapter already live shares its slot (unless it is
        draining for a request that came before this one); a new one needs a free slot.
        """
        if adapter_id == BASE:
            return True
        if adapter_id in self._adapters:
            return not (self._skipped and adapter_id == self._live.draining)
        if len(self._adapters) < self._max:
            self._adapters.add(adapter_id)
            return True
        self._skipped = True
        if self._live.draining is None:
            self._live.draining = self._live.fewest_requests()
        return False


class LiveAdapters:
    """Admitted requests per adapter, from admission until the batcher releases them."""

    def __init__(self, max_loras: int) -> None:
        if max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {max_loras}")
        self.max_loras = max_loras
        self._requests: Counter[str] = Counter()
        # The live adapter giving its slot up to a request that found none (AdmissionGate).
        self.draining: str | None = None

    @property
    def distinct(self) -> int:
        """Distinct adapters (the base model excluded) with a request on the shards."""
        return len(self._requests)

    def live(self) -> frozenset[str]:
        return frozenset(self._requests)

    def fewest_requests(self) -> str | None:
        """The live adapter likely to leave its slot first; the earliest live one on a tie."""
        return min(self._requests, key=self._requests.__getitem__, default=None)

    def gate(self) -> AdmissionGate:
        return AdmissionGate(self)

    def acquire(self, adapter_id: str) -> None:
        if adapter_id != BASE:
            self._requests[adapter_id] += 1

    def release(self, adapter_id: str) -> None:
        if adapter_id == BASE:
            return
        self._requests[adapter_id] -= 1
        if self._requests[adapter_id] <= 0:
            del self._requests[adapter_id]
            if self.draining == adapter_id:
                self.draining = None

    def clear(self) -> None:
        self._requests.clear()
        self.draining = None
