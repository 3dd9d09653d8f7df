"""The shard's gRPC servicer: keeps cached batches by id and runs steps on the model runner.

Model steps block (and, with several shards, wait on collectives), so they run off the event
loop, which keeps answering Health and Info. They all run on one dedicated thread, the same one
that loaded the model: torch keeps an OpenMP worker pool per calling thread, and a second pool
on a small CPU makes every step markedly slower (bench/omp_threads.py shows it). One thread also
runs the steps strictly one at a time.
"""

import asyncio
import gc
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import torch

from shard import wire
from shard.batch import Batch
from shard.faults import Faults
from shard.kv_cache import KvCacheSettings, plan_num_blocks, plan_state_slots
from shard.lora.manager import LoraManager
from shard.platforms import platform_of
from shard.platforms.cuda.graphs import block_table_width
from shard.request_checks import CacheShape, check_distinct, check_new_requests
from shard.requests import NewRequest
from shard.runner import ForwardFailed, ModelRunner, StepTimings
from shard.sampling.graph_heads import DEFAULT_TOP_N
from shard.sockets import shard_url
from shard.state_slots import DEFAULT_STATE_SLOTS, assign_state_slots
from shard.steps_ahead import StepsAhead
from switchyard_pb import generate_pb2, generate_pb2_grpc

log = logging.getLogger(__name__)


class ShardStopped(RuntimeError):
    """The shard cannot go on serving (its reason: TextGenerationService.fatal)."""


@dataclass(frozen=True)
class ShardIdentity:
    model_id: str
    dtype: str
    uds_path: str
    attention: str


class TextGenerationService(generate_pb2_grpc.TextGenerationServiceServicer):
    def __init__(
        self,
        runner: ModelRunner,
        identity: ShardIdentity,
        kv_settings: KvCacheSettings,
        torch_thread: ThreadPoolExecutor | None = None,
        lora: LoraManager | None = None,
        faults: Faults | None = None,
        overlap: bool = False,
    ) -> None:
        self.runner = runner
        self.identity = identity
        self.kv_settings = kv_settings
        self.lora = lora
        self.cache: dict[int, Batch] = {}
        # Decode steps queued before the router asked for them (shard/steps_ahead.py).
        self.ahead = StepsAhead(runner, overlap)
        self.torch_thread = torch_thread or ThreadPoolExecutor(1, thread_name_prefix="torch")
        # Faults injected on purpose (shard/faults.py), armed once Warmup is done.
        self.faults = faults
        # Set when this shard must stop serving (see _abort_on_error), with why.
        self.stopped = asyncio.Event()
        self.fatal: str | None = None

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.torch_thread, fn, *args)

    async def _abort_on_error(self, context, fn, *args):
        """Runs a step; a failure becomes a gRPC error carrying the message, never a crash.

        A refusal (ValueError, KeyError: a malformed request, refused the same way on every
        rank before any collective) and, with one shard, any failure cost the RPC alone. With
        several shards, a failure inside the forward pass may have left a peer waiting in a
        collective that will never complete: the ranks can no longer be trusted to be in step,
        so this shard answers ABORTED and stops, and the launcher stops the pod."""
        try:
            return await self._run(fn, *args)
        except ForwardFailed as e:
            if self.runner.dist.world_size > 1:
                reason = self._stop_diverged(e)
                await context.abort(grpc.StatusCode.ABORTED, reason)
            log.exception("step failed")
            await context.abort(grpc.StatusCode.INTERNAL, str(e))
        except (ValueError, KeyError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Exception as e:  # the router turns this into an error for the affected batch only
            log.exception("step failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

    def _stop_diverged(self, error: ForwardFailed) -> str:
        dist = self.runner.dist
        reason = (
            f"shard {dist.rank}: the forward pass failed ({error}); with {dist.world_size} shards "
            "the ranks may no longer be in step, so this shard stops"
        )
        log.error("%s", reason, exc_info=error)
        self.fatal = reason
        # After the answer has gone out: serve() ends and the process exits (shard/__main__.py).
        asyncio.get_running_loop().call_later(0.1, self.stopped.set)
        return reason

    async def Info(self, request, context):
        model = self.runner.model
        return generate_pb2.InfoResponse(
            model_id=self.identity.model_id,
            dtype=self.identity.dtype,
            device_type=platform_of(self.runner.device).name,
            block_size=self.runner.block_size,
            world_size=self.runner.dist.world_size,
            vocab_size=model.vocab_size,
            max_position_embeddings=model.max_position_embeddings,
            attention_impl=self.identity.attention,
            eos_token_ids=model.eos_token_ids,
            rope_regime_boundary=model.config.rope_regime_boundary,
            draft_model_id=self.runner.draft.model_id if self.runner.draft is not None else "",
            recurrent_state=model.recurrent,
        )

    async def Health(self, request, context):
        platform_of(self.runner.device).check_alive(self.runner.device)
        return generate_pb2.HealthResponse()

    async def ServiceDiscovery(self, request, context):
        urls = [shard_url(self.identity.uds_path, r) for r in range(self.runner.dist.world_size)]
        return generate_pb2.ServiceDiscoveryResponse(urls=urls)

    async def ClearCache(self, request, context):
        if request.HasField("id"):
            self.cache.pop(request.id, None)
            self.ahead.drop(request.id)
        else:
            self.cache.clear()
            self.ahead.drop()
        return generate_pb2.ClearCacheResponse()

    def _cached(self, batch_id: int) -> Batch:
        if batch_id not in self.cache:
            raise ValueError(f"no cached batch {batch_id} on this shard")
        return self.cache[batch_id]

    async def FilterBatch(self, request, context):
        def filter_batch():
            if not request.request_ids:
                raise ValueError("FilterBatch needs request ids to keep (ClearCache drops a batch)")
            check_distinct(list(request.request_ids), "FilterBatch's request ids")
            batch = self._cached(request.batch_id)
            kept = batch.filter(list(request.request_ids))
            if self.ahead.has(batch.id):
                rows = torch.tensor(batch.rows(list(request.request_ids)))
                self.ahead.filter(batch.id, kept.id, rows)
            self.cache[kept.id] = kept
            return generate_pb2.FilterBatchResponse(batch=wire.cached_batch(kept))

        return await self._abort_on_error(context, filter_batch)

    def _take(self, cached: list[generate_pb2.CachedBatch]) -> list[Batch]:
        """Removes cached batches for a step; a bad id leaves the cache intact."""
        check_distinct([b.id for b in cached], "the cached batches of a step")
        batches = [self._cached(b.id) for b in cached]
        for b in cached:
            del self.cache[b.id]
        return batches

    def _step(
        self, batches: list[Batch], chunks, token_masks, proposals=None, draft_tokens: int = 0
    ) -> tuple[list[generate_pb2.Generation], StepTimings, Batch]:
        """One step over `batches` as one batch (the first one's id): those with a step queued
        ahead (shard/steps_ahead.py) answer from it, the others run a step now, verifying
        `proposals` (a proto map of Proposal by request id; speculative decoding) and, with a
        draft model, guessing `draft_tokens` for the next. The result is cached, and its next
        step queued ahead where it can be. A batch answered from a step ahead answers its one
        token: proposals for its rows are not verified."""
        if self.runner.faults is not None:
            self.runner.faults.before_step()
        ahead = [b for b in batches if self.ahead.has(b.id)]
        now = [b for b in batches if not self.ahead.has(b.id)]
        chunks, token_masks = dict(chunks), dict(token_masks)
        known = {r.id for b in batches for r in b.requests}
        unknown = set(chunks) - known
        if unknown:
            raise ValueError(f"prefill_chunks name requests {sorted(unknown)} not in this step")
        proposals = dict(proposals or {})
        unknown = set(proposals) - known
        if unknown:
            raise ValueError(f"proposals name requests {sorted(unknown)} not in this step")
        check_draft_tokens(draft_tokens, self.runner)
        generations, timings = [], StepTimings(0, 0)
        for batch in ahead:
            gens, taken = self.ahead.take(batch)
            generations, timings = generations + gens, timings + taken
        if now:
            stepped = Batch.concat(now)
            ids = {r.id for r in stepped.requests}
            gens, ran = self.runner.step(
                stepped,
                {k: v for k, v in chunks.items() if k in ids},
                {k: v for k, v in token_masks.items() if k in ids},
                {k: list(p.ids) for k, p in proposals.items() if k in ids},
                {k: list(p.token_masks) for k, p in proposals.items() if k in ids},
                draft_tokens,
            )
            generations, timings = generations + gens, timings + ran
            ahead.append(stepped)
        batch = Batch.concat(ahead)
        batch.id = batches[0].id
        self.cache[batch.id] = batch
        if not proposals and not draft_tokens:  # the router sends the next step's proposals
            self.ahead.launch(batch)
        return [wire.generation(g) for g in generations], timings, batch

    async def Prefill(self, request, context):
        def prefill():
            start = time.perf_counter_ns()
            if request.batch.id in self.cache and not request.cached_batches:
                raise ValueError(f"batch {request.batch.id} is already cached on this shard")
            if not request.batch.requests and not request.cached_batches:
                raise ValueError("Prefill needs new requests or cached batches")
            requests = [wire.new_request(r) for r in request.batch.requests]
            live = [r.id for b in self.cache.values() for r in b.requests]
            check_new_requests(requests, self._cache_shape(), live)
            requests, slots, failures = self._assign_adapters(requests)
            new = []
            if requests:  # else every new request failed for its adapter
                runner = self.runner
                new = [
                    Batch.start(request.batch.id, requests, runner.device, runner.model.recurrent)
                ]
                new[0].lora_slots = slots.to(new[0].lora_slots.device)
                if new[0].state_slots is not None:  # before _take: its batches hold slots too
                    live = [b.state_slots for b in self.cache.values()]
                    new[0].state_slots = assign_state_slots(len(requests), live, runner.state_slots)
            batches = [*self._take(list(request.cached_batches)), *new]
            response = generate_pb2.PrefillResponse(
                adapter_failures=failures, lora=self._lora_stats()
            )
            if batches:
                failed = {rid for f in failures for rid in f.request_ids}
                chunks = {k: v for k, v in request.prefill_chunks.items() if k not in failed}
                generations, timings, batch = self._step(
                    batches, chunks, request.token_masks, request.proposals, request.draft_tokens
                )
                response.generations.extend(generations)
                response.batch.CopyFrom(wire.cached_batch(batch))
                response.forward_ns, response.decode_ns = timings.forward_ns, timings.decode_ns
            response.total_ns = time.perf_counter_ns() - start
            return response

        return await self._abort_on_error(context, prefill)

    def _cache_shape(self) -> CacheShape:
        runner = self.runner
        return CacheShape(runner.model.vocab_size, runner.num_blocks, runner.block_size)

    def _lora_stats(self) -> generate_pb2.LoraStats | None:
        if self.lora is None:
            return None
        stats = self.lora.stats
        return generate_pb2.LoraStats(
            slots_in_use=self.lora.slots_in_use(),
            host_cache_hits=stats.hits,
            host_cache_misses=stats.misses,
            host_cache_evictions=stats.evictions,
        )

    def _assign_adapters(
        self, requests: list[NewRequest]
    ) -> tuple[list[NewRequest], torch.Tensor, list[generate_pb2.AdapterFailure]]:
        """The requests that can start, their adapters' device slots (-1: the base model), and
        the requests that cannot because their adapter's files could not be read again.

        Never serves a request for an adapter with the base model: an adapter we do not know
        is an error for the batch (the router validates first, so this is a backstop)."""
        adapter_ids = [r.adapter_id for r in requests]
        if not any(adapter_ids):
            return requests, torch.full((len(requests),), -1, dtype=torch.int32), []
        if self.lora is None:
            named = sorted({a for a in adapter_ids if a})
            raise ValueError(f"LoRA adapter(s) {named} requested, but none are loaded")
        live = [b.lora_slots for b in self.cache.values()]
        assignment = self.lora.assign(adapter_ids, live)
        keep = [i for i, a in enumerate(adapter_ids) if a not in assignment.failed]
        failures = [
            generate_pb2.AdapterFailure(
                adapter_id=name,
                reason=reason,
                request_ids=[r.id for r in requests if r.adapter_id == name],
            )
            for name, reason in assignment.failed.items()
        ]
        return [requests[i] for i in keep], assignment.slots[keep], failures

    async def LoadAdapter(self, request, context):
        def load():
            self._lora_manager().add(request.name, Path(request.path))
            return generate_pb2.LoadAdapterResponse()

        # On the torch thread, between steps: the host cache and the slots are its state.
        return await self._abort_on_error(context, load)

    async def UnloadAdapter(self, request, context):
        def unload():
            live = [b.lora_slots for b in self.cache.values()]
            self._lora_manager().remove(request.name, live)
            return generate_pb2.UnloadAdapterResponse()

        return await self._abort_on_error(context, unload)

    def _lora_manager(self) -> LoraManager:
        if self.lora is None:
            raise ValueError(
                "this shard has no LoRA support: start it with --enable-lora (the launcher "
                "does with --enable-lora-runtime-loading) or --lora-adapters"
            )
        return self.lora

    async def Decode(self, request, context):
        def decode():
            start = time.perf_counter_ns()
            if not request.batches:
                raise ValueError("Decode needs at least one cached batch")
            batches = self._take(list(request.batches))
            concat_done = time.perf_counter_ns()
            generations, timings, batch = self._step(
                batches,
                request.prefill_chunks,
                request.token_masks,
                request.proposals,
                request.draft_tokens,
            )
            return generate_pb2.DecodeResponse(
                generations=generations,
                batch=wire.cached_batch(batch),
                concat_ns=concat_done - start,
                forward_ns=timings.forward_ns,
                decode_ns=timings.decode_ns,
                total_ns=time.perf_counter_ns() - start,
                lora=self._lora_stats(),
            )

        return await self._abort_on_error(context, decode)

    async def Warmup(self, request, context):
        def warmup():
            runner = self.runner
            self.cache.clear()
            self.ahead.drop()
            # The worst-case batch only needs blocks up to the highest id it references.
            highest = max((b for r in request.batch.requests for b in r.blocks), default=0)
            # A model with linear attention holds a state per running sequence: as many as the
            # router's --max-batch-size (without: a default, fewer where memory is short),
            # reported back as the limit.
            slots = 0
            if runner.model.recurrent:
                slots = plan_state_slots(
                    runner.model.state_bytes_per_slot(),
                    self.kv_settings,
                    runner.device,
                    request.max_batch_size,
                    DEFAULT_STATE_SLOTS,
                )
            # rotary tables for the longest request the router admits (and the most proposals
            # a step verifies past it), before the cache takes what memory is left
            longest = request.max_total_tokens or runner.model.max_position_embeddings
            runner.tabulate_positions(longest + MAX_DRAFT_TOKENS)
            runner.allocate_kv_cache(highest + 1, max(slots, len(request.batch.requests)))
            platform_of(runner.device).reset_peak_memory(runner.device)
            if request.batch.requests:
                run_warmup_steps(runner, request.batch)
            # The decode graphs' memory, measured by capturing them once against this small
            # cache, is set aside before the real cache takes the rest; then they are captured
            # again against the real one.
            width = graph_table_width(request.max_total_tokens, runner)
            # The warmup batch asks for the most alternatives the router allows.
            top_n = max((r.top_n_tokens for r in request.batch.requests), default=DEFAULT_TOP_N)
            graphs_bytes = runner.capture_graphs(width, top_n)
            runner.free_kv_cache()  # the warmup cache and those graphs
            gc.collect()
            platform_of(runner.device).release_cached_memory(runner.device)
            num_blocks = plan_num_blocks(
                runner.kv_cache_bytes_per_token(),
                self.kv_settings,
                runner.device,
                request.max_batch_total_tokens,
                reserved_bytes=graphs_bytes + slots * runner.model.state_bytes_per_slot(),
            )
            runner.allocate_kv_cache(num_blocks, slots)
            runner.capture_graphs(width, top_n)
            log.info("KV cache: %d blocks of %d tokens", num_blocks, runner.block_size)
            runner.faults = self.faults
            return generate_pb2.WarmupResponse(
                max_supported_total_tokens=num_blocks * runner.block_size,
                num_blocks=num_blocks,
                max_batch_size=slots,
            )

        return await self._abort_on_error(context, warmup)


# The most guesses a step may ask of the draft model: the router's cap on proposals.
MAX_DRAFT_TOKENS = 16


def check_draft_tokens(draft_tokens: int, runner: ModelRunner) -> None:
    if draft_tokens and runner.draft is None:
        raise ValueError("draft_tokens asked of a shard without a draft model (--draft-model)")
    if draft_tokens > MAX_DRAFT_TOKENS:
        raise ValueError(f"draft_tokens must be at most {MAX_DRAFT_TOKENS}, got {draft_tokens}")


def graph_table_width(max_total_tokens: int, runner: ModelRunner) -> int:
    """Block table columns the decode graphs hold: enough for the longest request the router
    admits (the model's context when it did not say)."""
    tokens = max_total_tokens or runner.model.config.max_position_embeddings
    return block_table_width(tokens, runner.block_size)


def run_warmup_steps(runner: ModelRunner, batch: generate_pb2.Batch) -> None:
    """Runs the worst-case `batch` as one prefill step; with --compile, first the steps that
    compile every graph a step can reach (CompiledForward.warm_up)."""

    def worst_case() -> None:
        runner.step(wire.new_batch(batch, runner.device, runner.model.recurrent)[0])

    if not runner.compiled:
        worst_case()
        return
    first = batch.requests[0]
    one = generate_pb2.Batch(id=batch.id, requests=[first], size=1)

    def first_tokens(n: int) -> None:  # n tokens of the first prompt (fewer when it is shorter)
        runner.step(wire.new_batch(one, runner.device, runner.model.recurrent)[0], {first.id: n})

    runner.forward.warm_up(worst_case, first_tokens, sum(len(r.input_ids) for r in batch.requests))


async def serve(service: TextGenerationService, rank: int) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1),
        ]
    )
    generate_pb2_grpc.add_TextGenerationServiceServicer_to_server(service, server)
    url = shard_url(service.identity.uds_path, rank)
    server.add_insecure_port(url)
    await server.start()
    log.info("shard %d serving on %s", rank, url)
    stopped = asyncio.ensure_future(service.stopped.wait())
    terminated = asyncio.ensure_future(server.wait_for_termination())
    try:
        await asyncio.wait({stopped, terminated}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        terminated.cancel()
    if service.fatal is not None:
        raise ShardStopped(service.fatal)
