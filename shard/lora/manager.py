"""Adapters on a shard: a host LRU cache of `max_cpu_loras` adapters read from disk, and
`max_loras` device slots in every LoRA-capable layer (seeds 000 and 002).

The router guarantees that the requests live on the shards never name more than `max_loras`
distinct adapters, so `assign` always finds a slot: a slot is free when no cached batch row
refers to it (derived from the batches themselves, so there is no refcount to keep in step
with FilterBatch and ClearCache). A free slot keeps its adapter until it is needed for another
one, least recently used first, so an adapter that comes back soon costs no copy.

An adapter evicted from the host cache is read again when a batch asks for it, and the file
may have changed or vanished since it was validated. `assign` then reports the adapter as failed
instead of raising, so the shard starts the rest of the batch without its requests; with several
shards the ranks first agree on the failures (one small all-reduce), since a rank that ran the
step while another refused it would leave their batches, and their collectives, out of step.

Runtime loading (docs/lora.md): `add` reads and validates an adapter before it becomes known,
`remove` forgets it everywhere. The router sends a removal only once none of the adapter's
requests is live; `remove` still refuses one a cached batch uses, since reusing that slot for
another adapter would silently change those requests' weights.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

import torch
from torch import nn

from shard.distributed import Distributed
from shard.layers.linear import ColumnParallelLinear, RowParallelLinear
from shard.layers.lora import LoraStep, LoraTerm
from shard.layers.quant.base import Piece
from shard.lora.adapter import AdapterError, LoraAdapter, read_adapter
from shard.models.base import CausalLM
from shard.platforms import platform_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraSettings:
    adapters: Mapping[str, Path]  # name -> PEFT directory
    max_loras: int = 4
    max_cpu_loras: int | None = None  # None: max(max_loras, number of adapters)
    max_rank: int = 64


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


@dataclass(frozen=True)
class Assignment:
    """A new batch's adapters: each request's device slot, and the adapters that could not be
    read, whose requests must not start (their slot is -1 only so the tensor has a row)."""

    slots: torch.Tensor  # [B] int32, -1 for the base model
    failed: dict[str, str]  # adapter -> why (for the log)


@dataclass
class _Slots:
    names: list[str | None]
    last_used: list[int] = field(default_factory=list)
    clock: int = 0


class LoraManager:
    def __init__(
        self,
        model: nn.Module,
        settings: LoraSettings,
        *,
        triton: bool = False,
        dist: Distributed | None = None,
    ) -> None:
        if settings.max_loras < 1:
            raise ValueError(f"--max-loras must be at least 1, got {settings.max_loras}")
        self.settings = settings
        self.dist = dist or Distributed()
        self.max_cpu_loras = settings.max_cpu_loras or max(
            settings.max_loras, len(settings.adapters)
        )
        self.step = LoraStep(
            scaling=torch.zeros(settings.max_loras, device=model.device),
            scaling_host=[0.0] * settings.max_loras,
            triton=triton,
            # The platform's kernel for small steps' terms where it has one (the CPU's native
            # one, where it could be built), unless the Triton kernels take them all.
            native=None if triton else platform_of(model.device).lora_kernel(),
            dtype=model.dtype,
        )
        self.layers = _attach(model, self.step, settings, model.dtype, model.device)
        self.module_shapes = {m: s for layer, _ in self.layers for m, s in _shapes(layer).items()}
        # Adapters' module names as the checkpoint's (a CausalLM knows its layouts; the tests'
        # bare layers are named as their checkpoint).
        self.resolve = model.adapter_module if isinstance(model, CausalLM) else _same_module
        # The adapters known now: the startup ones, then those added and removed at runtime.
        self.paths: dict[str, Path] = {n: Path(p) for n, p in settings.adapters.items()}
        self.cache: OrderedDict[str, LoraAdapter] = OrderedDict()
        self.stats = CacheStats()
        self.slots = _Slots(names=[None] * settings.max_loras, last_used=[0] * settings.max_loras)
        for name in self.paths:  # every adapter is validated before the shard serves
            self._adapter(name)

    @property
    def names(self) -> list[str]:
        return list(self.paths)

    # -- runtime loading -----------------------------------------------------------------

    def add(self, name: str, path: Path) -> None:
        """Reads and validates the adapter, then keeps it under `name` (AdapterError if not)."""
        if not name:
            raise AdapterError("an adapter needs a non-empty name")
        if name in self.paths:
            raise AdapterError(f"adapter {name!r} is already loaded")
        self.paths[name] = Path(path)
        try:
            self._adapter(name)  # a refused adapter leaves no trace
        except BaseException:
            del self.paths[name]
            raise
        log.info("LoRA adapter %s loaded from %s", name, path)

    def remove(self, name: str, live_slots: Iterable[torch.Tensor] = ()) -> None:
        """Forgets the adapter: its name, host cache entry and device slot. `live_slots`: the
        lora_slots of every cached batch, none of which may still use it."""
        if name not in self.paths:
            known = ", ".join(self.names) or "none"
            raise AdapterError(f"adapter {name!r} is not loaded; loaded: {known}")
        slots = self.slots
        if name in slots.names:
            slot = slots.names.index(name)
            if any(bool((t == slot).any()) for t in live_slots):
                raise AdapterError(
                    f"adapter {name!r} is still used by a cached batch; it can be unloaded "
                    "only once its requests are finished"
                )
            self._free(slot)
        del self.paths[name]
        self.cache.pop(name, None)
        log.info("LoRA adapter %s unloaded", name)

    # -- host cache ----------------------------------------------------------------------

    def _adapter(self, name: str) -> LoraAdapter:
        if name in self.cache:
            self.stats.hits += 1
            self.cache.move_to_end(name)
            return self.cache[name]
        self.stats.misses += 1
        adapter = read_adapter(
            name,
            self.paths[name],
            max_rank=self.settings.max_rank,
            module_shapes=self.module_shapes,
            resolve=self.resolve,
        )
        self.cache[name] = adapter
        while len(self.cache) > self.max_cpu_loras:
            evicted, _ = self.cache.popitem(last=False)
            self.stats.evictions += 1
            log.info("LoRA host cache full: evicted %s", evicted)
        return adapter

    # -- device slots --------------------------------------------------------------------

    def assign(self, adapter_ids: Sequence[str], live_slots: Iterable[torch.Tensor]) -> Assignment:
        """The slots for the requests of a new batch ("" -> -1), loading adapters into slots no
        live batch row uses. `live_slots`: the lora_slots of every cached batch."""
        unknown = sorted({a for a in adapter_ids if a and a not in self.paths})
        if unknown:
            known = ", ".join(self.names) or "none"
            raise ValueError(f"unknown LoRA adapter(s) {unknown}; loaded: {known}")
        names = list(dict.fromkeys(a for a in adapter_ids if a))
        busy = {int(s) for t in live_slots for s in t.tolist() if s >= 0}
        chosen: dict[str, int] = {}
        failed: dict[str, str] = {}
        for name in names:
            try:
                chosen[name] = self._slot_for(name, busy)
            except _Unreadable as err:
                log.error("LoRA adapter %s could not be read: %s", name, err.reason)
                failed[name] = err.reason
                continue
            busy.add(chosen[name])
        for name in self._failed_elsewhere(names, failed):
            failed[name] = "it could not be read on another shard (that shard's log says why)"
            self._free(chosen.pop(name))
        slots = [chosen.get(a, -1) for a in adapter_ids]
        return Assignment(torch.tensor(slots, dtype=torch.int32), failed)

    def _failed_elsewhere(self, names: list[str], failed: Mapping[str, str]) -> list[str]:
        """The adapters this rank read but another could not. Every rank calls this for every
        batch with adapters, so the all-reduce always has all ranks in it."""
        if self.dist.world_size == 1 or not names:
            return []
        flags = torch.tensor([n in failed for n in names], dtype=torch.int32)
        flags = self.dist.all_reduce(flags.to(self.dist.device)).cpu()
        return [n for n, f in zip(names, flags.tolist(), strict=True) if f and n not in failed]

    def _slot_for(self, name: str, busy: set[int]) -> int:
        slots = self.slots
        slots.clock += 1
        if name in slots.names:
            slot = slots.names.index(name)
        else:
            try:
                adapter = self._adapter(name)
            except Exception as err:  # validated when added: its files changed since
                raise _Unreadable(f"{type(err).__name__}: {err}") from err
            free = [s for s in range(len(slots.names)) if s not in busy]
            if not free:
                raise ValueError(
                    f"adapter {name!r} needs a slot but all {len(slots.names)} are in use "
                    "(the router must not schedule more than --max-loras adapters at once)"
                )
            slot = min(free, key=lambda s: (slots.names[s] is not None, slots.last_used[s]))
            self._load(slot, adapter)
            slots.names[slot] = name
        slots.last_used[slot] = slots.clock
        return slot

    def _free(self, slot: int) -> None:
        """Empties a slot no row uses yet; it is taken first, its weights overwritten then."""
        self.slots.names[slot] = None
        self.slots.last_used[slot] = 0

    def _load(self, slot: int, adapter: LoraAdapter) -> None:
        for layer, term in self.layers:
            term.fill(slot, _rank_parts(layer, adapter))
        self.step.set_scaling(slot, adapter.scaling)

    def slots_in_use(self) -> int:
        return sum(name is not None for name in self.slots.names)


class _Unreadable(Exception):
    """A known adapter's files could not be read again (after a host cache eviction)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _shapes(layer: nn.Module) -> dict[str, tuple[int, int]]:
    return dict(layer.module_shapes)


def _sub_modules(pieces: Sequence[Piece]) -> list[list[Piece]]:
    """A column layer's pieces grouped by checkpoint module: consecutive pieces of one prefix
    are one sub-module of its LoRA term. A checkpoint that fuses q/k/v (or gate/up) into one
    tensor, as Phi-3's does, has a PEFT adapter on that fused module: one A for all of its
    rows, one B cut like the weight. Kept as one sub-module, the shrink multiplies that A once
    rather than once per piece, and the expand writes the rank's q, k and v rows in one go."""
    return [list(group) for _, group in groupby(pieces, key=lambda p: p.prefix)]


def _rank_parts(
    layer: ColumnParallelLinear | RowParallelLinear, adapter: LoraAdapter
) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """The adapter's A and B for each sub-module of `layer`, cut like its weight."""
    if isinstance(layer, RowParallelLinear):
        piece = layer.input_piece
        ab = adapter.modules.get(piece.prefix)
        return [None if ab is None else (ab[0][:, piece.start : piece.stop], ab[1])]
    parts = []
    for pieces in _sub_modules(layer.pieces):
        ab = adapter.modules.get(pieces[0].prefix)
        if ab is None:
            parts.append(None)
            continue
        # this rank's rows of B, piece by piece (of a fused module: its q, k, v or gate, up)
        parts.append((ab[0], torch.cat([ab[1][p.start : p.stop] for p in pieces])))
    return parts


def _same_module(name: str) -> str:
    return name


def _attach(
    model: nn.Module,
    step: LoraStep,
    settings: LoraSettings,
    dtype: torch.dtype,
    device: torch.device,
) -> list[tuple[nn.Module, LoraTerm]]:
    """Gives every TP linear of the model a LoRA term with `max_loras` empty slots."""
    attached = []
    for module in model.modules():
        if isinstance(module, RowParallelLinear):
            piece = module.input_piece
            out_slices = (module.weight.out_features,)
            in_features = piece.stop - piece.start
        elif isinstance(module, ColumnParallelLinear):
            out_slices = tuple(sum(p.size for p in sub) for sub in _sub_modules(module.pieces))
            in_features = module.weight.in_features
        else:
            continue
        module.lora = LoraTerm(
            step,
            num_slots=settings.max_loras,
            max_rank=settings.max_rank,
            in_features=in_features,
            out_slices=out_slices,
            dtype=dtype,
            device=device,
        )
        attached.append((module, module.lora))
    return attached
