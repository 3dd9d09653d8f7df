"""Prometheus metrics for GET /metrics through prometheus_client, with TGI's names where it has one.

Each router owns its registry (not prometheus_client's global one): tests run many routers in one
process, and a registry per app keeps their numbers apart. prometheus_client appends `_total` to
counters, so TGI's `tgi_request_count` is exported as `tgi_request_count_total`. Gauges are not
kept up to date by hand: a collector reads them from the router's state at scrape time, so they
cannot drift from the truth (KV blocks used/free come straight from the allocator).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shard.lora.names import BASE_LABEL
from switchyard_pb import generate_pb2 as pb

# `*_created` series double the output and no dashboard reads them.
prometheus_client.disable_created_metrics()

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
# Request-level latencies: from sub-millisecond (tiny models) to minutes (long generations).
REQUEST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# One prefill or decode step.
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
TOKEN_BUCKETS = tuple(float(2**i) for i in range(17))  # 1 .. 65536 tokens
BATCH_BUCKETS = tuple(float(2**i) for i in range(11))  # 1 .. 1024 requests

GAUGE_HELP = {
    "tgi_queue_size": "Requests waiting to be admitted",
    "tgi_batch_current_size": "Requests in the running batch",
    "tgi_batch_current_max_tokens": "Tokens reserved by the running batch",
    "switchyard_requests_in_flight": "Requests holding a concurrency permit",
    "switchyard_kv_blocks_total": "KV cache blocks the allocator hands out",
    "switchyard_kv_blocks_used": "KV cache blocks reserved by admitted requests",
    "switchyard_kv_blocks_free": "KV cache blocks free",
    "switchyard_lora_adapters_live": "Distinct LoRA adapters with requests on the shards",
    "switchyard_lora_max_loras": "Distinct LoRA adapters the shards hold at once (--max-loras)",
    "switchyard_prefix_cache_blocks": "KV blocks holding a cached prompt prefix (in use or not)",
}
COUNTER_HELP = {
    "switchyard_prefix_cache_evictions": "Cached prefix blocks evicted to make room",
}


def adapter_label(adapter_id: str) -> str:
    """The `adapter` label: the adapter's name, BASE_LABEL for the base model. Only validated
    requests reach the metrics, so the label's values are bounded by the adapters loaded."""
    return adapter_id or BASE_LABEL


class _StateReader(Collector):
    """Values read from the router's state at scrape time: gauges, or counters it keeps
    cumulatively itself (CounterMetricFamily)."""

    def __init__(
        self,
        read: Callable[[], dict[str, float]],
        family: type[GaugeMetricFamily] | type[CounterMetricFamily],
        help_texts: dict[str, str],
    ) -> None:
        self._read, self._family, self._help = read, family, help_texts

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        for name, value in self._read().items():
            yield self._family(name, self._help.get(name, name), value=value)


class _ShardLora(Collector):
    """The shards' own LoRA numbers as rank 0 last reported them with a step: cumulative
    counters kept by the shard (so they are exported as it counts them, not re-counted here)
    and the slots in use."""

    def __init__(self) -> None:
        self.stats: pb.LoraStats | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if self.stats is None:
            return
        yield GaugeMetricFamily(
            "switchyard_lora_slots_in_use",
            "Device adapter slots holding an adapter on the shards",
            value=self.stats.slots_in_use,
        )
        for field, doc in (
            ("host_cache_hits", "LoRA adapters found in the shards' host cache"),
            ("host_cache_misses", "LoRA adapters read from disk by the shards"),
            ("host_cache_evictions", "LoRA adapters evicted from the shards' host cache"),
        ):
            name = f"switchyard_lora_{field}"
            yield CounterMetricFamily(name, doc, value=getattr(self.stats, field))


class Metrics:
    """Everything the router counts; the methods are the events it counts them at."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=False)
        self._shard_lora = _ShardLora()  # registered with the first report from a shard
        self.requests = Counter("tgi_request_count", "Generation requests received", registry=r)
        self.successes = Counter("tgi_request_success", "Requests that finished", registry=r)
        self.failures = Counter(
            "tgi_request_failure", "Requests that failed, by error_type", ["err"], registry=r
        )
        self.cancellations = Counter(
            "switchyard_request_cancelled", "Requests whose client went away", registry=r
        )
        self.input_tokens = Counter("switchyard_prompt_tokens", "Prompt tokens", registry=r)
        self.cached_prompt_tokens = Counter(
            "switchyard_prompt_tokens_cached",
            "Prompt tokens read from the prefix cache at admission",
            registry=r,
        )
        self.computed_prompt_tokens = Counter(
            "switchyard_prompt_tokens_computed",
            "Prompt tokens the shards computed (those not read from the prefix cache)",
            registry=r,
        )
        self.generated_tokens = Counter(
            "switchyard_generated_tokens", "Generated tokens", registry=r
        )
        adapter = ("adapter",)
        self.adapter_requests = Counter(
            "switchyard_adapter_requests",
            "Generation requests queued, by LoRA adapter (`base`: the base model)",
            adapter,
            registry=r,
        )
        self.adapter_tokens = Counter(
            "switchyard_adapter_generated_tokens",
            "Generated tokens, by LoRA adapter (`base`: the base model)",
            adapter,
            registry=r,
        )

        def hist(name: str, doc: str, buckets: tuple[float, ...], labels=()) -> Histogram:
            return Histogram(name, doc, list(labels), buckets=buckets, registry=r)

        self.duration = hist("tgi_request_duration", "End-to-end request latency", REQUEST_BUCKETS)
        self.validation = hist(
            "tgi_request_validation_duration", "Tokenization and validation", REQUEST_BUCKETS
        )
        self.queue = hist("tgi_request_queue_duration", "Waiting in the queue", REQUEST_BUCKETS)
        self.inference = hist(
            "tgi_request_inference_duration", "Time from admission to the end", REQUEST_BUCKETS
        )
        self.time_per_token = hist(
            "tgi_request_mean_time_per_token_duration", "Mean time per token", STEP_BUCKETS
        )
        self.ttft = hist(
            "switchyard_time_to_first_token_seconds", "Arrival to first token", REQUEST_BUCKETS
        )
        self.itl = hist(
            "switchyard_inter_token_latency_seconds", "Between two tokens", STEP_BUCKETS
        )
        self.input_length = hist("tgi_request_input_length", "Prompt tokens", TOKEN_BUCKETS)
        self.output_length = hist("tgi_request_generated_tokens", "Tokens generated", TOKEN_BUCKETS)
        self.max_new_tokens = hist("tgi_request_max_new_tokens", "max_new_tokens", TOKEN_BUCKETS)
        self.next_size = hist("tgi_batch_next_size", "Requests per prefill", BATCH_BUCKETS)
        self.concat = Counter(
            "tgi_batch_concat",
            "Prefills joining a running batch, by reason",
            ["reason"],
            registry=r,
        )
        method = ("method",)
        self.step_count = Counter(
            "tgi_batch_inference_count", "Prefill/decode steps", method, registry=r
        )
        self.step_success = Counter(
            "tgi_batch_inference_success", "Steps that succeeded", method, registry=r
        )
        # The shards measure these (forward_ns, decode_ns, total_ns in each answer).
        self.step_forward = hist(
            "tgi_batch_forward_duration", "Model forward per step", STEP_BUCKETS, method
        )
        self.step_decode = hist(
            "tgi_batch_decode_duration", "Sampling and output per step", STEP_BUCKETS, method
        )
        self.step_total = hist(
            "tgi_batch_inference_duration", "Whole step on the shard", STEP_BUCKETS, method
        )

        # Speculative decoding (router/speculation/), vLLM's spec_decode names under our prefix.
        # Mean accepted run: accepted / drafts; tokens per verifying step: emitted / drafts.
        self.spec_drafts = Counter(
            "switchyard_spec_decode_num_drafts",
            "Proposals sent: one per request and step that had proposed tokens",
            registry=r,
        )
        self.spec_draft_tokens = Counter(
            "switchyard_spec_decode_num_draft_tokens", "Proposed tokens sent", registry=r
        )
        self.spec_accepted_tokens = Counter(
            "switchyard_spec_decode_num_accepted_tokens",
            "Proposed tokens the shards' samples agreed with",
            registry=r,
        )
        self.spec_accepted_per_pos = Counter(
            "switchyard_spec_decode_num_accepted_tokens_per_pos",
            "Proposed tokens accepted, by their index in the proposal (0: the first)",
            ["position"],
            registry=r,
        )
        self.spec_emitted_tokens = Counter(
            "switchyard_spec_decode_num_emitted_tokens",
            "Tokens the steps with a proposal produced for it: the accepted ones and the token "
            "sampled after them",
            registry=r,
        )

    def watch(
        self,
        read_gauges: Callable[[], dict[str, float]],
        read_counters: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        """Registers the router state's gauges and cumulative counters, read at each scrape."""
        self.registry.register(_StateReader(read_gauges, GaugeMetricFamily, GAUGE_HELP))
        if read_counters is not None:
            self.registry.register(_StateReader(read_counters, CounterMetricFamily, COUNTER_HELP))

    def track_adapters(self, names: list[str]) -> None:
        """Every adapter's series exists from the start, at 0, so rates work from the first
        request on."""
        for label in (BASE_LABEL, *names):
            self.adapter_requests.labels(adapter=label)
            self.adapter_tokens.labels(adapter=label)

    def untrack_adapter(self, name: str) -> None:
        """An unloaded adapter's series go (its requests are all finished): the label's values
        stay those of the adapters loaded now."""
        for counter in (self.adapter_requests, self.adapter_tokens):
            try:
                counter.remove(name)
            except KeyError:
                pass

    def track_speculation(self, num_speculative_tokens: int) -> None:
        """Every position's series exists from the start, at 0 (the label's values are bounded
        by num_speculative_tokens)."""
        for position in range(num_speculative_tokens):
            self.spec_accepted_per_pos.labels(position=str(position))

    def shard_lora(self, stats: pb.LoraStats) -> None:
        if self._shard_lora.stats is None:
            self.registry.register(self._shard_lora)
        self._shard_lora.stats = stats

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- events --------------------------------------------------------------------------------

    def request_failed(self, error_type: str) -> None:
        self.failures.labels(err=error_type).inc()

    def step_started(self, method: str) -> None:
        self.step_count.labels(method=method).inc()

    def step_done(self, method: str, forward_ns: int, decode_ns: int, total_ns: int) -> None:
        self.step_success.labels(method=method).inc()
        self.step_forward.labels(method=method).observe(forward_ns / 1e9)
        self.step_decode.labels(method=method).observe(decode_ns / 1e9)
        self.step_total.labels(method=method).observe(total_ns / 1e9)

    def prefill_batch(self, size: int, concat_reason: str | None) -> None:
        """concat_reason: why new requests joined a running batch (None: a fresh batch)."""
        self.next_size.observe(size)
        if concat_reason is not None:
            self.concat.labels(reason=concat_reason).inc()

    def admitted(self, queue_s: float) -> None:
        self.queue.observe(queue_s)

    def prompt_cache(self, cached: int, prompt: int) -> None:
        self.cached_prompt_tokens.inc(cached)
        self.computed_prompt_tokens.inc(prompt - cached)

    def queued(self, adapter_id: str) -> None:
        self.adapter_requests.labels(adapter=adapter_label(adapter_id)).inc()

    def token(self, since_previous_s: float, first: bool, adapter_id: str = "") -> None:
        self.generated_tokens.inc()
        self.adapter_tokens.labels(adapter=adapter_label(adapter_id)).inc()
        (self.ttft if first else self.itl).observe(since_previous_s)

    def speculated(self, proposed: int, accepted: int, emitted: int) -> None:
        """One request's proposal in a step and the shards' verdict on it."""
        self.spec_drafts.inc()
        self.spec_draft_tokens.inc(proposed)
        self.spec_accepted_tokens.inc(accepted)
        self.spec_emitted_tokens.inc(emitted)
        for position in range(accepted):
            self.spec_accepted_per_pos.labels(position=str(position)).inc()

    def finished(
        self,
        *,
        total_s: float,
        validation_s: float,
        inference_s: float,
        input_tokens: int,
        generated_tokens: int,
        max_new_tokens: int,
    ) -> None:
        self.successes.inc()
        self.duration.observe(total_s)
        self.validation.observe(validation_s)
        self.inference.observe(inference_s)
        self.time_per_token.observe(inference_s / max(generated_tokens, 1))
        self.input_length.observe(input_tokens)
        self.output_length.observe(generated_tokens)
        self.max_new_tokens.observe(max_new_tokens)
