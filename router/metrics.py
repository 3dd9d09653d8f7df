"""Prometheus text exposition for GET /metrics, with TGI's metric names where TGI has one.

Counters are plain integers bumped from the event loop (single-threaded, no locks needed);
gauges are read at scrape time. Step timings come from the shards' Prefill/Decode answers and
are exported as summaries (sum and count) per method.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class StepTimings:
    count: int = 0
    forward_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0

    def add(self, forward_ns: int, decode_ns: int, total_ns: int) -> None:
        self.count += 1
        self.forward_s += forward_ns / 1e9
        self.decode_s += decode_ns / 1e9
        self.total_s += total_ns / 1e9


@dataclass
class Metrics:
    requests: int = 0
    successes: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # by error_type
    generated_tokens: int = 0
    input_tokens: int = 0
    steps: dict[str, StepTimings] = field(
        default_factory=lambda: {"prefill": StepTimings(), "decode": StepTimings()}
    )

    def render(self, gauges: dict[str, float]) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{labels} {value:g}" for labels, value in samples)

        metric("tgi_request_count", "counter", [("", self.requests)])
        metric("tgi_request_success", "counter", [("", self.successes)])
        metric(
            "tgi_request_failure",
            "counter",
            [(f'{{err="{err}"}}', n) for err, n in sorted(self.failures.items())] or [("", 0)],
        )
        metric("tgi_request_generated_tokens_total", "counter", [("", self.generated_tokens)])
        metric("tgi_request_input_tokens_total", "counter", [("", self.input_tokens)])
        for part in ("forward", "decode", "total"):
            name = f"tgi_batch_{part}_duration_seconds"
            samples = []
            for method, t in self.steps.items():
                samples.append((f'_sum{{method="{method}"}}', getattr(t, f"{part}_s")))
                samples.append((f'_count{{method="{method}"}}', t.count))
            lines.append(f"# TYPE {name} summary")
            lines.extend(f"{name}{labels} {value:g}" for labels, value in samples)
        for name, value in gauges.items():
            metric(name, "gauge", [("", value)])
        return "\n".join(lines) + "\n"
