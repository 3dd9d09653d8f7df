"""The scheduler loop: continuous batching over one running batch (TGI's v3 loop, simplified).

What each step runs is the scheduling policy's decision (router/policies.py: chunked prefill by
default, TGI v2's whole prompts with --no-prefill-chunking); this module holds what every policy
shares: admission with KV blocks, the Prefill and Decode RPCs, results, release and failure.

After every step the router applies its own stopping decisions and drops finished or abandoned
requests with FilterBatch (ClearCache when none remain), giving their KV blocks back. A failing
RPC fails only the requests of the batches it was about; the loop itself never dies. Their
clients get a short error; what failed inside goes to the log with their request ids.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from router.adapters import LiveAdapters
from router.block_allocator import BlockAllocator
from router.client import ShardClient, ShardsLost
from router.entry import Entry
from router.errors import (
    GenerationError,
    IncompleteGenerationError,
    RouterError,
    ServerStoppingError,
    internal_failure,
)
from router.metrics import Metrics
from router.policies import ChunkedPolicy, SchedulingPolicy, WholePromptPolicy
from router.queue import Queue
from router.results import Results
from router.speculation.grammar import check_drafts
from router.speculation.speculator import Speculator
from router.step_deadlines import DEFAULT_STEP_TIMEOUT_S, StepDeadlines
from router.step_trace import StepTrace
from router.tokenizer import Tokenizer
from switchyard_pb import generate_pb2 as pb

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_prefill_tokens: int
    max_batch_total_tokens: int
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20
    max_batch_size: int | None = None  # None: only the token budgets bound a batch
    # Spread prompts over steps mixed with decoding: prefill_chunk_tokens per step while any
    # request decodes (more when a wave of prompts waits, router/chunking.py), and
    # max_batch_prefill_tokens when none does (nobody is stalled then).
    prefill_chunking: bool = True
    prefill_chunk_tokens: int | None = None  # None: max_batch_prefill_tokens
    max_loras: int = 4  # distinct LoRA adapters live on the shards at once (router/adapters.py)
    # --shard-step-timeout (router/step_deadlines.py); None: steps are never timed out.
    shard_step_timeout: float | None = DEFAULT_STEP_TIMEOUT_S


class Batcher:
    def __init__(
        self,
        client: ShardClient,
        queue: Queue,
        allocator: BlockAllocator,
        tokenizer: Tokenizer,
        config: SchedulerConfig,
        metrics: Metrics | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        self.client = client
        self.queue = queue
        self.allocator = allocator
        self.tokenizer = tokenizer
        self.config = config
        self.metrics = metrics or Metrics()
        self.trace = StepTrace()  # the step timeline GET /debug/steps serves
        self.results = Results(tokenizer, self.metrics)
        # Speculative decoding (router/speculation/); None: off.
        self.speculator = speculator
        self.entries: dict[int, Entry] = {}  # admitted requests, by id
        self.adapters = LiveAdapters(config.max_loras)  # the adapters of `entries`
        self.running: pb.CachedBatch | None = None
        # From 1: the warmup batch was 0, and 0 reads as "unset" in proto3 dumps.
        self._batch_ids = itertools.count(1)
        # What each step runs (router/policies.py).
        self.policy: SchedulingPolicy = (
            ChunkedPolicy() if config.prefill_chunking else WholePromptPolicy()
        )
        # Held for each step, never while waiting for work: whoever holds it between steps sees
        # the shards' cached batches hold exactly `entries` (a runtime adapter unload needs that).
        self.between_steps = asyncio.Lock()
        self.deadlines = StepDeadlines(config.shard_step_timeout)

    # -- loop ---------------------------------------------------------------------------------

    async def run_forever(self) -> None:
        try:
            while True:
                if self.running is None:
                    await self.queue.wait()
                async with self.between_steps:
                    await self._guarded_step()
        finally:
            self._abort_all()

    async def _guarded_step(self) -> None:
        try:
            await self.step()
        except (asyncio.CancelledError, ShardsLost):
            raise
        except Exception as err:  # a bug must cost its batch, never the server
            log.exception(
                "scheduler step failed; failing request(s) %s", self._request_ids(self.entries)
            )
            try:
                await self._reset(internal_failure(err))
            except Exception:
                log.exception("scheduler reset failed")
                self.entries.clear()
                if self.speculator is not None:
                    self.speculator.clear()
                self.adapters.clear()
                self.running = None

    async def step(self) -> None:
        """One step; with nothing running it starts requests only if some are queued (the loop
        waits for them first, outside `between_steps`)."""
        self.metrics.cancellations.inc(len(self.queue.drop_gone()))
        if self.running is not None:
            self.running = await self._prune(self.running)
        await self.policy.step(self)

    def fail_unfittable_head(self) -> None:
        if len(self.queue) and not self.entries:
            # Startup checks make this impossible; failing beats spinning forever.
            head = self.queue.pop_head()
            head.fail(GenerationError("request does not fit in an empty KV cache"))

    def admit(
        self,
        prefill_budget: int,
        running_size: int,
        min_size: int | None = None,
        chunking: bool = False,
    ) -> list[Entry]:
        """Waiting requests that fit beside the running batch, with their KV blocks reserved."""
        cfg = self.config
        max_size = None
        if cfg.max_batch_size is not None:
            max_size = cfg.max_batch_size - running_size
            if max_size <= 0:
                return []
        reserved = sum(e.request.total_tokens for e in self.entries.values())
        reserved -= self.allocator.shared_tokens  # a shared prefix block counts once
        return self.queue.next_batch(
            self.allocator,
            prefill_token_budget=prefill_budget,
            token_budget=cfg.max_batch_total_tokens - reserved,
            min_size=min_size,
            max_size=max_size,
            chunking=chunking,
            adapters=self.adapters.gate(),
        )

    # -- RPCs ---------------------------------------------------------------------------------

    async def prefill(
        self,
        entries: list[Entry],
        concat_reason: str | None = None,
        cached: pb.CachedBatch | None = None,
        chunks: dict[int, int] | None = None,
    ) -> pb.CachedBatch | None:
        """Starts a batch of new requests; `cached` (the running batch) steps in the same pass."""
        now = time.monotonic()
        for entry in entries:
            self.entries[entry.id] = entry
            self.adapters.acquire(entry.request.adapter_id)
            entry.started_at = now
            self.metrics.admitted(now - entry.queued_at)
            self.metrics.prompt_cache(entry.cached_tokens, entry.request.input_length)
        self.metrics.prefill_batch(len(entries), concat_reason)
        requests = [e.to_proto() for e in entries]
        batch = pb.Batch(
            id=next(self._batch_ids),
            requests=requests,
            size=len(requests),
            max_tokens=sum(e.request.total_tokens for e in entries),
            max_blocks=max(len(r.blocks) for r in requests),
        )
        cached_batches = [cached] if cached is not None else []
        ids = [rid for b in cached_batches for rid in b.request_ids] + [e.id for e in entries]
        masks = await self._token_masks(ids)
        # The cached batch's decoding rows may take proposals; the new requests are in their
        # prompt.
        proposals, draft_tokens = await self._speculation(ids)
        self.metrics.step_started("prefill")
        tokens = self._trace_begin("prefill", ids, chunks, len(entries), proposals)
        try:
            response = await self.client.prefill(
                batch,
                cached_batches,
                chunks or {},
                masks,
                self.deadlines.next_step(tokens),
                proposals=proposals,
                draft_tokens=draft_tokens,
            )
        except Exception as err:
            self.trace.failed()
            self._lost_if_fatal(err)
            # Every request of the step fails, like a failed Decode: the shards' copy of the
            # cached batch can no longer be trusted.
            self._fail_internal(f"prefill of batch {batch.id}", ids, err)
            for batch_id in [batch.id, *(b.id for b in cached_batches)]:
                await self._clear(batch_id)
            return None
        self.metrics.step_done(
            "prefill", response.forward_ns, response.decode_ns, response.total_ns
        )
        self.trace.answered(response.forward_ns, response.decode_ns, response.total_ns)
        if response.HasField("lora"):
            self.metrics.shard_lora(response.lora)
        self._fail_adapter_requests(response.adapter_failures)
        self._record_prompt_progress(chunks, entries)
        self._cache_computed(ids)
        self._handle(response.generations)
        result = response.batch if response.HasField("batch") else None
        settled = await self._settle(result, ids)
        self.trace.handled()
        return settled

    async def decode(
        self, batches: list[pb.CachedBatch], chunks: dict[int, int] | None = None
    ) -> pb.CachedBatch | None:
        ids = [rid for b in batches for rid in b.request_ids]
        masks = await self._token_masks(ids)
        proposals, draft_tokens = await self._speculation(ids)
        self.metrics.step_started("decode")
        tokens = self._trace_begin("decode", ids, chunks, 0, proposals)
        try:
            response = await self.client.decode(
                batches,
                chunks or {},
                masks,
                self.deadlines.next_step(tokens),
                proposals=proposals,
                draft_tokens=draft_tokens,
            )
        except Exception as err:
            self.trace.failed()
            self._lost_if_fatal(err)
            self._fail_internal(f"decode of batches {[b.id for b in batches]}", ids, err)
            for b in batches:
                await self._clear(b.id)
            return None
        self.metrics.step_done("decode", response.forward_ns, response.decode_ns, response.total_ns)
        self.trace.answered(response.forward_ns, response.decode_ns, response.total_ns)
        if response.HasField("lora"):
            self.metrics.shard_lora(response.lora)
        self._record_prompt_progress(chunks, [])
        self._cache_computed(ids)
        self._handle(response.generations)
        cached = response.batch if response.HasField("batch") else None
        settled = await self._settle(cached, ids)
        self.trace.handled()
        return settled

    async def _token_masks(self, ids: Sequence[int]) -> dict[int, bytes]:
        """What each constrained request of the step may sample (structured output), computed
        off the event loop (llguidance releases the GIL). A request whose grammar fails here
        fails alone; the shards still get a mask for it, and its token is never read."""
        constrained = [
            e for rid in ids if (e := self.entries.get(rid)) is not None and e.constraint
        ]
        if not constrained:
            return {}
        masks, failures = await asyncio.to_thread(_compute_masks, constrained)
        for entry, error in failures:
            log.error("request %s: %s", entry.request_id, error)
            self._fail([entry.id], error)
        return masks

    async def _speculation(self, ids: Sequence[int]) -> tuple[dict[int, pb.Proposal], int]:
        """Speculative decoding (router/speculation/): the tokens proposed after each decoding
        request's last one, and the guesses the step asks of the shards' draft model for each
        request that then decodes (0: none, or no draft model). A constrained request's
        proposal is cut at the first token its grammar refuses and carries the masks that follow
        each token, computed off the event loop like `_token_masks`; a request whose grammar
        fails there fails alone."""
        if self.speculator is None:
            return {}, 0
        live = [e for rid in ids if (e := self.entries.get(rid)) is not None]
        drafts = self.speculator.draft(live)
        constrained = [
            (self.entries[rid], d) for rid, d in drafts.items() if self.entries[rid].constraint
        ]
        checked: dict[int, tuple[list[int], list[bytes]]] = {}
        if constrained:
            checked, failures = await asyncio.to_thread(check_drafts, constrained)
            for entry, error in failures:
                log.error("request %s: %s", entry.request_id, error)
                self._fail([entry.id], error)
        proposals: dict[int, pb.Proposal] = {}
        for rid, draft in drafts.items():
            entry = self.entries.get(rid)
            if entry is None:  # failed above
                continue
            if entry.constraint is None:
                proposals[rid] = pb.Proposal(ids=draft)
                continue
            kept, masks = checked[rid]
            if kept:
                proposals[rid] = pb.Proposal(ids=kept, token_masks=masks)
        self.speculator.sent(proposals)
        return proposals, self.speculator.draft_tokens(live)  # failed ones are done

    def _trace_begin(
        self,
        kind: str,
        ids: Sequence[int],
        chunks: dict[int, int] | None,
        new: int,
        proposals: dict[int, pb.Proposal] | None = None,
    ) -> int:
        """A step's shape for the timeline: rows still in their prompt compute their chunk
        (default: the rest of it), the others decode one token and the tokens proposed after
        it. Returns the tokens it computes."""
        prefill_tokens = decode_rows = 0
        for rid in ids:
            entry = self.entries.get(rid)
            if entry is None:
                continue
            left = entry.prompt_left
            if left > 0:
                prefill_tokens += min(left, (chunks or {}).get(rid, left))
            else:
                decode_rows += 1
        proposed = sum(len(p.ids) for p in (proposals or {}).values())
        self.trace.begin(kind, prefill_tokens, decode_rows, new, proposed)
        return prefill_tokens + decode_rows + proposed

    def _record_prompt_progress(self, chunks: dict[int, int] | None, started: list[Entry]) -> None:
        """What the shards computed of each prompt: the chunks, else the started prompts whole."""
        if not chunks:
            for entry in started:
                entry.prompt_done = entry.request.input_length
            return
        for rid, n in chunks.items():
            entry = self.entries.get(rid)
            if entry is not None:
                entry.prompt_done += n

    def _cache_computed(self, ids: Sequence[int]) -> None:
        """Offers the blocks this step filled to the prefix cache, before any request of it
        finishes and gives its blocks back."""
        for rid in ids:
            entry = self.entries.get(rid)
            if entry is not None and entry.allocation is not None:
                self.allocator.commit(entry.allocation, entry.computed_len, entry.known_tokens)

    async def _prune(self, batch: pb.CachedBatch) -> pb.CachedBatch | None:
        """Drops requests whose client went away before spending a step on them."""
        gone = [rid for rid in batch.request_ids if rid in self.entries and self.entries[rid].gone]
        for rid in gone:
            self._release(self.entries[rid])
        self.metrics.cancellations.inc(len(gone))
        return await self._settle(batch, list(batch.request_ids)) if gone else batch

    async def _settle(
        self, cached: pb.CachedBatch | None, sent_ids: Sequence[int]
    ) -> pb.CachedBatch | None:
        """Makes the shards' cached batch hold exactly the router's live requests."""
        returned = set(cached.request_ids) if cached is not None else set()
        lost = [rid for rid in sent_ids if rid in self.entries and rid not in returned]
        if lost:
            error = GenerationError("the shard dropped the request from its batch")
            self._fail_internal("a step", lost, error)
        if cached is None:
            return None
        keep = [rid for rid in cached.request_ids if rid in self.entries]
        if len(keep) == len(cached.request_ids):
            return cached
        deadline = self.deadlines.between_steps_s
        try:
            if not keep:
                await self.client.clear_cache(cached.id, deadline)
                return None
            return await self.client.filter_batch(cached.id, keep, deadline)
        except Exception as err:
            self._lost_if_fatal(err)
            self._fail_internal(f"filtering batch {cached.id}", keep, err)
            await self._clear(cached.id)
            return None

    async def _clear(self, batch_id: int | None) -> None:
        try:
            await self.client.clear_cache(batch_id, self.deadlines.between_steps_s)
        except Exception as err:  # the shard may be gone; its requests already failed
            self._lost_if_fatal(err)
            log.warning("ClearCache(%s) failed: %s", batch_id, err)

    # -- results ------------------------------------------------------------------------------

    def _handle(self, generations: Iterable[pb.Generation]) -> None:
        for gen in generations:
            entry = self.entries.get(gen.request_id)
            if entry is None:
                continue
            if entry.gone:
                self._release(entry)
                self.metrics.cancellations.inc()
                continue
            try:
                if self.speculator is not None:
                    self.trace.accepted(self.speculator.verify(entry, gen))
                finished = self.results.apply(entry, gen)
            except Exception as err:  # one bad answer costs its request only
                log.exception("handling the generation of request %s failed", entry.request_id)
                self._fail(
                    [entry.id], err if isinstance(err, RouterError) else internal_failure(err)
                )
                continue
            if finished:
                self._release(entry)

    # -- bookkeeping --------------------------------------------------------------------------

    def _release(self, entry: Entry) -> None:
        if self.entries.pop(entry.id, None) is not None:
            self.adapters.release(entry.request.adapter_id)
        if self.speculator is not None:
            self.speculator.forget(entry.id)
        entry.done = True
        if entry.allocation is not None:
            self.allocator.free(entry.allocation.blocks)
            entry.allocation = None

    def _request_ids(self, ids: Iterable[int]) -> str:
        """The HTTP request ids of these entries, as the log names them."""
        return ", ".join(self.entries[rid].request_id for rid in ids if rid in self.entries)

    def _fail_internal(self, what: str, ids: Sequence[int], err: BaseException) -> None:
        """Fails requests after an internal failure: the log gets the detail with their ids
        (a shard's exception may be pages of gloo or CUDA text), the clients a short error."""
        log.error("%s failed for request(s) %s: %s", what, self._request_ids(ids), err)
        self._fail(ids, err if isinstance(err, RouterError) else internal_failure(err))

    def _fail_adapter_requests(self, failures: Iterable[pb.AdapterFailure]) -> None:
        """The shards started a Prefill's batch without the requests whose adapter they could
        not read again: those alone fail, and the adapter stays known (its files may be back
        for the next request)."""
        for failure in failures:
            name = failure.adapter_id
            log.error(
                "LoRA adapter %s could not be read (%s); failing request(s) %s",
                name, failure.reason, self._request_ids(failure.request_ids),
            )  # fmt: skip
            error = GenerationError(
                f"LoRA adapter {name!r} could not be read by the shards; the server log says why"
            )
            self._fail(failure.request_ids, error)

    def _fail(self, ids: Iterable[int], error: RouterError) -> None:
        for rid in ids:
            entry = self.entries.get(rid)
            if entry is not None:
                if not entry.done:
                    self.metrics.request_failed(error.error_type)
                entry.fail(error)
                self._release(entry)

    def _lost_if_fatal(self, err: BaseException) -> None:
        """When the shards can no longer serve (a step past its deadline, a shard that stopped
        itself): every request fails, now and from here on, and the loop ends with ShardsLost
        (router/infer.py stops the router, the launcher the pod)."""
        if not isinstance(err, ShardsLost):
            return
        log.error(
            "the shards can no longer serve: %s%s; failing request(s) %s and stopping",
            err, f" ({err.detail})" if err.detail else "", self._request_ids(self.entries),
        )  # fmt: skip
        self.queue.closed = ServerStoppingError(f"the server is stopping: {err}")
        error = GenerationError(f"{err}; the server is stopping")
        self._fail(list(self.entries), error)
        for entry in self.queue.drain():
            entry.fail(error)
        self.running = None
        raise err

    async def _reset(self, error: RouterError) -> None:
        self._fail(list(self.entries), error)
        self.running = None
        await self._clear(None)

    def _abort_all(self) -> None:
        """On shutdown: nobody waits forever."""
        error = IncompleteGenerationError()
        self._fail(list(self.entries), error)
        for entry in self.queue.drain():
            entry.fail(error)
        self.running = None


def _compute_masks(
    entries: list[Entry],
) -> tuple[dict[int, bytes], list[tuple[Entry, RouterError]]]:
    masks: dict[int, bytes] = {}
    failures: list[tuple[Entry, RouterError]] = []
    for entry in entries:
        assert entry.constraint is not None
        try:
            masks[entry.id] = entry.constraint.mask()
        except RouterError as err:
            masks[entry.id] = ANY_TOKEN_MASK
            failures.append((entry, err))
    return masks, failures


# A failed request's stand-in mask (its token is dropped): the shards refuse an empty one.
ANY_TOKEN_MASK = b"\xff\xff\xff\xff"
