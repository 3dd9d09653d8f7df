"""Runtime LoRA adapter management: vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter
behind --enable-lora-runtime-loading (docs/lora.md).

Load: the name must be new, the path a directory inside --lora-dir (router/lora_paths.py). Every
shard reads and validates the adapter (LoadAdapter); only once all of them hold it do requests
naming it pass validation. When some shards refuse it, those that took it unload it again and
the refusal is reported: a name never means different things on different shards.

Unload: from the first moment, new requests naming the adapter are refused as unknown; those
already queued or running are served to the end (they were accepted: refusing them now would
break that promise). Then, between two scheduler steps, when the shards' cached batches hold no
row of it, the shards forget it (UnloadAdapter) and the name is free again.

Operations on one name run one at a time; different names do not wait for each other (an unload
may wait minutes for a long request). Each operation runs to its end even when its HTTP client
goes away: stopping half-way would leave the router and the shards disagreeing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from router.adapters import AdapterSpecError, LoraAdapter, check_names
from router.client import ShardError
from router.errors import AdapterNotFoundError, AdapterRequestError, RouterError
from router.keyed_lock import KeyedLock
from router.lora_paths import resolve_lora_path
from shard.lora.names import MAX_ADAPTER_NAME_CHARS

if TYPE_CHECKING:
    from router.infer import Infer

log = logging.getLogger(__name__)
T = TypeVar("T")
# How often an unload looks whether the adapter's last request has finished.
UNLOAD_POLL_S = 0.02


def lora_name(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise AdapterRequestError("`lora_name` must be a non-empty string")
    if len(value) > MAX_ADAPTER_NAME_CHARS:  # also on unload, whose 404 would echo it
        raise AdapterRequestError(
            f"`lora_name` must be at most {MAX_ADAPTER_NAME_CHARS} characters. Given: {len(value)}"
        )
    return value


class LoraRuntime:
    def __init__(self, infer: Infer, lora_dir: str) -> None:
        self.infer = infer
        self.lora_dir = lora_dir
        self._names = KeyedLock()
        self._running: set[asyncio.Task[Any]] = set()

    async def load(self, name: object, lora_path: object) -> LoraAdapter:
        name = lora_name(name)
        try:
            check_names([name], self.infer.adapters.model_name)
        except AdapterSpecError as err:
            raise AdapterRequestError(f"`lora_name`: {err}") from None
        # Checked before any shard is asked: they must never open a path outside --lora-dir.
        path = resolve_lora_path(lora_path, self.lora_dir)
        return await self._to_the_end(self._load(name, path))

    async def unload(self, name: object) -> None:
        await self._to_the_end(self._unload(lora_name(name)))

    async def _to_the_end(self, operation: Coroutine[Any, Any, T]) -> T:
        task = asyncio.ensure_future(operation)
        self._running.add(task)  # a strong reference while it runs on without its client
        task.add_done_callback(self._finished)
        return await asyncio.shield(task)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retrieved: never unlogged
            log.info("runtime LoRA operation ended with: %s", task.exception())

    async def _load(self, name: str, path: str) -> LoraAdapter:
        registry = self.infer.adapters
        async with self._names.hold(name):
            if registry.on_shards(name):
                raise AdapterRequestError(f"The LoRA adapter {name!r} has already been loaded")
            outcomes = await self.infer.client.load_adapter(name, path)
            failed = {rank: err for rank, err in outcomes.items() if err is not None}
            if failed:
                took = [rank for rank, err in outcomes.items() if err is None]
                if took:
                    await self._undo(name, took)
                raise _refusal(failed, took)
            adapter = LoraAdapter(name, path)
            registry.add(adapter)
            self.infer.metrics.track_adapters([name])
            log.info("LoRA adapter %s loaded from %s", name, path)
            return adapter

    async def _undo(self, name: str, ranks: list[int]) -> None:
        outcomes = await self.infer.client.unload_adapter(name, ranks)
        for err in outcomes.values():
            if err is not None:
                log.error("adapter %s: undoing a partial load failed: %s", name, err)

    async def _unload(self, name: str) -> None:
        registry = self.infer.adapters
        async with self._names.hold(name):
            if not registry.serving(name):
                raise AdapterNotFoundError(name, registry.names)
            registry.close(name)  # new requests for it are refused from here on
            waiting = self.infer.requests_for(name)
            if waiting:
                log.info("unloading LoRA adapter %s after its %d request(s)", name, waiting)
            while self.infer.requests_for(name):
                await asyncio.sleep(UNLOAD_POLL_S)
            # Between steps, the shards' cached batches hold exactly the live requests: none of
            # them uses the adapter any more, so its slot can be given up.
            async with self.infer.batcher.between_steps:
                outcomes = await self.infer.client.unload_adapter(name)
            # Gone from the router whatever the shards said: no request can use it any more.
            registry.remove(name)
            self.infer.allocator.forget_adapter(name)  # its cached K/V die with its weights
            self.infer.metrics.untrack_adapter(name)
            failed = {rank: err for rank, err in outcomes.items() if err is not None}
            if failed:
                rank, err = min(failed.items())
                log.error("adapter %s: UnloadAdapter failed: %s", name, err)
                raise RouterError(f"{err.summary}; the server log has the details")
            log.info("LoRA adapter %s unloaded", name)


def _refusal(failed: dict[int, ShardError], took: list[int]) -> RouterError:
    """What the client learns: the shard's own reason when it refused the adapter (it names the
    adapter and says why), else only which call failed where (the detail goes to the log)."""
    rank, err = min(failed.items())
    cause = err.cause
    refused = isinstance(cause, grpc.aio.AioRpcError)
    refused = refused and cause.code() == grpc.StatusCode.INVALID_ARGUMENT
    if not refused:
        log.error("LoadAdapter failed: %s", err)
        return RouterError(f"{err.summary}; the server log has the details")
    reason = cause.details() or "refused"
    if took:
        ranks = ", ".join(str(r) for r in sorted(failed))
        reason += f" (refused by shard(s) {ranks}; unloaded again from the others)"
    return AdapterRequestError(reason)
