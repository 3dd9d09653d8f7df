"""The router's composition root: builds its parts (validator, queue, block allocator, batcher,
metrics, LoRA runtime) from the flags and the shards' answers, and owns the scheduler task.

The generation handlers do not talk to it but to `generations` (router/generations.py:
validate, permit, submit); the introspection routes (/info, /metrics, /v1/models, /health,
/debug/steps) read it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from router.adapters import AdapterRegistry
from router.args import RouterArgs
from router.batcher import Batcher, SchedulerConfig
from router.block_allocator import BlockAllocator
from router.chat_features import chat_features
from router.client import ShardClient, ShardsLost
from router.generations import ConcurrencyLimit, Generations, ModelInfo, stop_token_ids
from router.limits import RESERVED_BLOCKS, Limits
from router.lora_runtime import LoraRuntime
from router.metrics import Metrics
from router.prefix_cache import PrefixCache
from router.queue import Queue
from router.speculation.speculator import Speculator
from router.structured import Grammars
from router.tokenizer import Tokenizer
from router.validation import ValidationLimits, Validator
from switchyard_pb import generate_pb2 as pb

log = logging.getLogger(__name__)


def model_info(info: pb.InfoResponse, model_name: str) -> ModelInfo:
    return ModelInfo(
        model_id=model_name,
        dtype=info.dtype,
        device_type=info.device_type,
        world_size=info.world_size,
        eos_token_ids=tuple(info.eos_token_ids),
        vocab_size=info.vocab_size or None,
        rope_regime_boundary=info.rope_regime_boundary,
    )


class Infer:
    def __init__(
        self,
        args: RouterArgs,
        limits: Limits,
        model: ModelInfo,
        client: ShardClient,
        tokenizer: Tokenizer,
    ) -> None:
        if args.prefix_caching is None:  # not fitted to the model (router/model_fit.py): on
            args = replace(args, prefix_caching=True)
        self.args = args
        self.limits = limits
        self.model = model
        self.client = client
        self.tokenizer = tokenizer
        self.adapters = AdapterRegistry(
            args.lora_adapters, model.model_id, runtime_loading=args.enable_lora_runtime_loading
        )
        validator = Validator(
            tokenizer,
            ValidationLimits(
                max_input_tokens=limits.max_input_tokens,
                max_total_tokens=limits.max_total_tokens,
                max_stop_sequences=args.max_stop_sequences,
                max_best_of=args.max_best_of,
                max_top_n_tokens=args.max_top_n_tokens,
                vocab_size=model.vocab_size,
                max_stop_sequence_length=args.max_stop_sequence_length,
                max_grammar_size=args.max_grammar_size,
            ),
            self.adapters,
            Grammars(tokenizer.decoder, stop_token_ids(model, tokenizer)),
        )
        self.queue = Queue()
        self.metrics = Metrics()
        self.limit = ConcurrencyLimit(args.max_concurrent_requests)
        self.generations = Generations(
            model, tokenizer, validator, self.limit, self.queue, self.adapters, self.metrics
        )
        self.generations.chat = chat_features(
            tokenizer.decoder,
            args.tool_call_parser,
            args.enable_auto_tool_choice,
            args.reasoning_parser,
        )
        self.metrics.watch(self.gauges, self.counters)
        self.metrics.track_adapters(self.adapters.names)
        self.allocator = BlockAllocator(
            limits.num_blocks,
            limits.block_size,
            RESERVED_BLOCKS,
            PrefixCache(limits.block_size, model.rope_regime_boundary)
            if args.prefix_caching
            else None,
        )
        self.batcher = Batcher(
            client,
            self.queue,
            self.allocator,
            tokenizer,
            SchedulerConfig(
                max_batch_prefill_tokens=limits.max_batch_prefill_tokens,
                max_batch_total_tokens=limits.batch_total_tokens,
                waiting_served_ratio=args.waiting_served_ratio,
                max_waiting_tokens=args.max_waiting_tokens,
                max_batch_size=args.max_batch_size,
                prefill_chunking=args.prefill_chunking,
                prefill_chunk_tokens=limits.prefill_chunk_tokens,
                max_loras=args.max_loras,
                shard_step_timeout=args.shard_step_timeout,
            ),
            self.metrics,
            Speculator(args.speculative_config, self.metrics, model.rope_regime_boundary)
            if args.speculative_config is not None
            else None,
        )
        # POST /v1/load_lora_adapter and /v1/unload_lora_adapter; None: off (404).
        self.lora_runtime = (
            LoraRuntime(self, args.lora_dir)
            if args.enable_lora_runtime_loading and args.lora_dir is not None
            else None
        )
        self.started_at = int(time.time())  # OpenAI's `created` of the model
        self._task: asyncio.Task[None] | None = None
        # Why the shards can no longer serve (None: they can); `lost` is set with it.
        self.failure: str | None = None
        self.lost = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.batcher.run_forever())
            self._task.add_done_callback(self._scheduler_ended)

    def _scheduler_ended(self, task: asyncio.Task[None]) -> None:
        """The loop only ends on its own when the shards are lost (router/batcher.py): from then
        on /health answers 503 and the router stops (router/server.py)."""
        if task.cancelled():
            return
        error = task.exception()
        self.failure = str(error) if error is not None else "the scheduler stopped"
        if not isinstance(error, ShardsLost):
            log.error("the scheduler stopped", exc_info=error)
        self.lost.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except ShardsLost:
                pass  # already reported: self.failure
            self._task = None

    @property
    def validator(self) -> Validator:
        return self.generations.validator

    def requests_for(self, adapter_id: str) -> int:
        """Requests for this adapter queued or on the shards, not yet released."""
        queued = sum(1 for e in self.queue if e.request.adapter_id == adapter_id)
        running = self.batcher.entries.values()
        return queued + sum(1 for e in running if e.request.adapter_id == adapter_id)

    def gauges(self) -> dict[str, float]:
        """Read at each /metrics scrape (see router.metrics)."""
        running = self.batcher.entries.values()
        cache = self.allocator.cache
        return {
            "tgi_queue_size": len(self.queue),
            "tgi_batch_current_size": len(running),
            "tgi_batch_current_max_tokens": sum(e.request.total_tokens for e in running),
            "switchyard_requests_in_flight": self.limit.in_flight,
            "switchyard_kv_blocks_total": self.allocator.capacity_blocks,
            "switchyard_kv_blocks_used": self.allocator.used_blocks,
            "switchyard_kv_blocks_free": self.allocator.free_blocks,
            "switchyard_lora_adapters_live": self.batcher.adapters.distinct,
            "switchyard_lora_max_loras": self.args.max_loras,
            "switchyard_prefix_cache_blocks": cache.cached_blocks if cache else 0,
        }

    def counters(self) -> dict[str, float]:
        cache = self.allocator.cache
        return {"switchyard_prefix_cache_evictions": cache.evictions if cache else 0}

    async def healthy(self) -> bool:
        """The shards answer Health. A probe still waiting (a frozen shard is awaited up to its
        timeout) ends as soon as the shards are known lost: the router answers 503 while it
        flushes its errors, not after it has gone."""
        if self.failure is not None:
            return False
        probe = asyncio.ensure_future(self.client.health())
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({probe, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not probe.done():
                probe.cancel()  # takes effect at its next await: it is not done yet
        if not probe.done() or probe.cancelled():
            return False
        if (err := probe.exception()) is not None:
            log.warning("health check failed: %s", err)
            return False
        return self.failure is None
