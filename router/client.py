"""gRPC client of the shards: every RPC goes to all of them at once, rank 0 answers.

Shards run each step in lock-step (they all-reduce inside the model), so a call that reached
only some ranks would hang the others: every request is sent to every shard concurrently and
the router waits for all of them before it looks at rank 0's answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from router.shard_agreement import check_agreement
from shard.sockets import shard_url
from switchyard_pb import generate_pb2 as pb
from switchyard_pb import generate_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# How often a starting router looks for a shard's socket: a small delay on a startup of seconds.
SOCKET_POLL_S = 0.02

# Prefill answers carry logprobs of whole prompts (and warmup batches are large): no size cap.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]


class ShardError(Exception):
    """An RPC failed on at least one shard."""

    def __init__(self, method: str, rank: int, cause: BaseException) -> None:
        detail = cause.details() if isinstance(cause, grpc.aio.AioRpcError) else str(cause)
        super().__init__(f"{method} failed on shard {rank}: {detail or type(cause).__name__}")
        self.method = method
        self.rank = rank
        self.cause = cause
        # What the client is told; the cause (e.g. gloo's RuntimeError text) goes to the log.
        self.summary = f"{method} failed on shard {rank}"


class ShardsLost(ShardError):
    """A shard stopped itself (ABORTED: its forward pass failed with several ranks, which may
    no longer be in step), or a step did not finish within its deadline: nothing more can be
    served, and the router stops (router/batcher.py)."""

    def __init__(self, method: str, rank: int, reason: str, detail: str = "") -> None:
        Exception.__init__(self, reason)
        self.method = method
        self.rank = rank
        self.cause = None
        self.summary = reason  # for clients too
        self.detail = detail  # the shard's own words, for the log only


def _stopped_itself(error: BaseException) -> bool:
    return isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.ABORTED


def _answers(method: str, results: list) -> list:
    """Every rank's answer, in rank order; the first rank's failure raised as a ShardError."""
    for rank, result in enumerate(results):
        if isinstance(result, BaseException):
            if isinstance(result, asyncio.CancelledError):
                raise result
            raise ShardError(method, rank, result) from result
    return results


async def _socket_exists(target: str, deadline: float, timeout: float) -> None:
    """Returns once a unix: target's socket file exists (at once for any other target);
    TimeoutError naming it at `deadline`."""
    if not target.startswith("unix:"):
        return
    path = Path(target.removeprefix("unix:").removeprefix("//"))
    loop = asyncio.get_running_loop()
    while not path.exists():
        if loop.time() >= deadline:
            raise TimeoutError(f"no shard is serving at {path} after {timeout:g} s")
        await asyncio.sleep(SOCKET_POLL_S)


def _as_target(url: str) -> str:
    # ServiceDiscovery may answer bare socket paths; gRPC needs the unix:// scheme.
    return url if "://" in url or url.startswith("unix:") else f"unix://{url}"


class ShardClient:
    def __init__(self, channels: Sequence[grpc.aio.Channel]) -> None:
        if not channels:
            raise ValueError("a ShardClient needs at least one shard")
        self._channels = list(channels)
        self._stubs = [pb_grpc.TextGenerationServiceStub(c) for c in self._channels]

    @property
    def world_size(self) -> int:
        return len(self._stubs)

    @classmethod
    async def connect(cls, uds_path: str, timeout: float = 60.0) -> ShardClient:
        """Connects to rank 0, then to every shard it lists in ServiceDiscovery, all within
        `timeout` seconds. A shard's socket appears once it has loaded its model and serves:
        the router waits for each to exist before it dials it, since gRPC would otherwise back
        off between failed attempts (1 s, growing) and connect seconds after the shard came up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        first_target = shard_url(uds_path, 0)
        await _socket_exists(first_target, deadline, timeout)
        first = grpc.aio.insecure_channel(first_target, options=CHANNEL_OPTIONS)
        try:
            await asyncio.wait_for(first.channel_ready(), max(0.0, deadline - loop.time()))
            stub = pb_grpc.TextGenerationServiceStub(first)
            urls = list((await stub.ServiceDiscovery(pb.ServiceDiscoveryRequest())).urls)
        except BaseException:
            await first.close()
            raise
        channels = [first]
        try:
            for url in urls:
                target = _as_target(url)
                if target == first_target:
                    continue
                await _socket_exists(target, deadline, timeout)
                channels.append(grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS))
            await asyncio.wait_for(
                asyncio.gather(*(c.channel_ready() for c in channels[1:])),
                max(0.0, deadline - loop.time()),
            )
        except BaseException:
            await asyncio.gather(*(c.close() for c in channels))
            raise
        log.info("connected to %d shard(s): %s", len(channels), urls or [first_target])
        return cls(channels)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels), return_exceptions=True)

    async def _all(self, method: str, request, timeout: float | None = None):
        return (await self._every(method, request, timeout))[0]

    async def _every(self, method: str, request, timeout: float | None = None) -> list:
        calls = [getattr(stub, method)(request, timeout=timeout) for stub in self._stubs]
        return _answers(method, await asyncio.gather(*calls, return_exceptions=True))

    async def _step(self, method: str, request, deadline_s: float | None) -> list:
        """A call that runs on the shards' torch threads, bounded by `deadline_s` (None: none).

        Waits for every shard (they step in lock-step), but not past the deadline, nor once a
        shard has stopped itself: its peers may never answer then (ShardsLost)."""
        calls = {
            asyncio.ensure_future(getattr(s, method)(request)): r for r, s in enumerate(self._stubs)
        }
        pending = set(calls)
        loop = asyncio.get_running_loop()
        end = None if deadline_s is None else loop.time() + deadline_s
        try:
            while pending:
                left = None if end is None else max(0.0, end - loop.time())
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    ranks = sorted(calls[c] for c in pending)
                    raise ShardsLost(method, ranks[0], await self._hang(method, ranks, deadline_s))
                for call in done:
                    error = call.exception()
                    if error is not None and _stopped_itself(error):
                        rank = calls[call]
                        reason = (
                            f"{method} failed on shard {rank}, which stopped: with several "
                            "shards, the ranks may no longer be in step"
                        )
                        raise ShardsLost(method, rank, reason, error.details())
        finally:
            for call in pending:
                call.cancel()
        return _answers(method, [call.exception() or call.result() for call in calls])

    async def _hang(self, method: str, ranks: list[int], deadline_s: float | None) -> str:
        """Names the shards a step waits for, and which of them no longer answer at all (a
        stopped or frozen process) rather than only the step (a step that never returns, or
        a collective waiting for a peer that does)."""

        async def answers(rank: int) -> bool:
            try:
                await self._stubs[rank].Health(pb.HealthRequest(), timeout=1.0)
            except Exception:
                return False
            return True

        alive = await asyncio.gather(*(answers(r) for r in ranks))
        silent = [r for r, ok in zip(ranks, alive, strict=True) if not ok]
        which = ", ".join(map(str, ranks))
        reason = (
            f"{method} did not finish within {round(deadline_s or 0, 1):g} s on shard(s) {which}"
        )
        if silent:
            named = ", ".join(map(str, silent))
            return f"{reason}; shard(s) {named} do not answer Health either (stopped or frozen)"
        return f"{reason}; they still answer Health: a step that never returns"

    async def _outcomes(
        self, method: str, request, ranks: Sequence[int] | None = None
    ) -> dict[int, ShardError | None]:
        """Each shard's outcome (None: it succeeded), nothing raised: for the runtime adapter
        calls, whose partial success the caller undoes (router/lora_runtime.py)."""
        ranks = range(self.world_size) if ranks is None else ranks
        calls = [getattr(self._stubs[r], method)(request) for r in ranks]
        results = await asyncio.gather(*calls, return_exceptions=True)
        outcomes: dict[int, ShardError | None] = {}
        for rank, result in zip(ranks, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            failed = isinstance(result, BaseException)
            outcomes[rank] = ShardError(method, rank, result) if failed else None
        return outcomes

    async def load_adapter(self, name: str, path: str) -> dict[int, ShardError | None]:
        return await self._outcomes("LoadAdapter", pb.LoadAdapterRequest(name=name, path=path))

    async def unload_adapter(
        self, name: str, ranks: Sequence[int] | None = None
    ) -> dict[int, ShardError | None]:
        return await self._outcomes("UnloadAdapter", pb.UnloadAdapterRequest(name=name), ranks)

    async def info(self) -> pb.InfoResponse:
        return await self._all("Info", pb.InfoRequest())

    async def health(self, timeout: float | None = 5.0) -> None:
        await self._all("Health", pb.HealthRequest(), timeout=timeout)

    async def warmup(self, request: pb.WarmupRequest) -> pb.WarmupResponse:
        """The smallest cache any shard can hold: a batch must fit on every rank."""
        answers = await self._every("Warmup", request)
        return min(answers, key=lambda a: (a.max_supported_total_tokens, a.num_blocks))

    async def prefill(
        self,
        batch: pb.Batch,
        cached_batches: Sequence[pb.CachedBatch] = (),
        chunks: Mapping[int, int] | None = None,
        token_masks: Mapping[int, bytes] | None = None,
        deadline_s: float | None = None,
        proposals: Mapping[int, pb.Proposal] | None = None,
        draft_tokens: int = 0,
    ) -> pb.PrefillResponse:
        request = pb.PrefillRequest(
            batch=batch,
            cached_batches=list(cached_batches),
            prefill_chunks=chunks or {},
            token_masks=token_masks or {},
            proposals=proposals or {},
            draft_tokens=draft_tokens,
        )
        answers = await self._step("Prefill", request, deadline_s)
        check_agreement("Prefill", answers)  # a divergence fails the batch: 424, ClearCache
        return answers[0]

    async def decode(
        self,
        batches: Sequence[pb.CachedBatch],
        chunks: Mapping[int, int] | None = None,
        token_masks: Mapping[int, bytes] | None = None,
        deadline_s: float | None = None,
        proposals: Mapping[int, pb.Proposal] | None = None,
        draft_tokens: int = 0,
    ) -> pb.DecodeResponse:
        request = pb.DecodeRequest(
            batches=list(batches),
            prefill_chunks=chunks or {},
            token_masks=token_masks or {},
            proposals=proposals or {},
            draft_tokens=draft_tokens,
        )
        answers = await self._step("Decode", request, deadline_s)
        check_agreement("Decode", answers)
        return answers[0]

    async def filter_batch(
        self, batch_id: int, request_ids: Sequence[int], deadline_s: float | None = None
    ) -> pb.CachedBatch:
        req = pb.FilterBatchRequest(batch_id=batch_id, request_ids=list(request_ids))
        return (await self._step("FilterBatch", req, deadline_s))[0].batch

    async def clear_cache(
        self, batch_id: int | None = None, deadline_s: float | None = None
    ) -> None:
        req = pb.ClearCacheRequest() if batch_id is None else pb.ClearCacheRequest(id=batch_id)
        await self._step("ClearCache", req, deadline_s)
