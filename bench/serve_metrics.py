"""Switchyard's own view of a run, from GET /metrics before and after: shard time vs wall time.

The router exports the shards' per-step timings (`tgi_batch_inference_duration`, the shard's
total_ns per Prefill/Decode). Between two scrapes, wall time minus the shards' busy time is
the time no shard was computing: router work (scheduling, detokenizing, streaming, gRPC) plus
idle waits for clients. Divided by the steps run, it is the router's added time per step.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import aiohttp

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
STEP = "tgi_batch_inference_duration"  # shard's whole step (total_ns), per method
FORWARD = "tgi_batch_forward_duration"


def parse_prometheus(text: str) -> dict[tuple[str, str], float]:
    """(metric name, label string) -> value, for every sample line."""
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


async def scrape(
    session: aiohttp.ClientSession, base_url: str
) -> dict[tuple[str, str], float] | None:
    """None when the server has no Prometheus /metrics with the shards' step timings."""
    try:
        async with session.get(f"{base_url}/metrics") as resp:
            if resp.status != 200:
                return None
            samples = parse_prometheus(await resp.text())
    except aiohttp.ClientError:
        return None
    return samples if any(name.startswith(STEP) for name, _ in samples) else None


@dataclass(frozen=True)
class ShardTime:
    decode_steps: int
    prefill_steps: int
    decode_step_mean_s: float  # shard's own time per Decode
    prefill_step_mean_s: float
    forward_share: float  # of the shards' step time, the model forward (rest: sampling, I/O)
    shard_busy_s: float
    wall_s: float
    # (wall - shard busy) / steps: what each step costs outside the shard, waits included.
    outside_shard_per_step_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def shard_time(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], wall_s: float
) -> ShardTime:
    def delta(name: str, method: str) -> float:
        key = (name, f'method="{method}"')
        return after.get(key, 0.0) - before.get(key, 0.0)

    d_n, p_n = delta(STEP + "_count", "decode"), delta(STEP + "_count", "prefill")
    d_s, p_s = delta(STEP + "_sum", "decode"), delta(STEP + "_sum", "prefill")
    fwd = delta(FORWARD + "_sum", "decode") + delta(FORWARD + "_sum", "prefill")
    busy = d_s + p_s
    steps = d_n + p_n
    return ShardTime(
        decode_steps=int(d_n),
        prefill_steps=int(p_n),
        decode_step_mean_s=d_s / d_n if d_n else float("nan"),
        prefill_step_mean_s=p_s / p_n if p_n else float("nan"),
        forward_share=fwd / busy if busy else float("nan"),
        shard_busy_s=busy,
        wall_s=wall_s,
        outside_shard_per_step_s=(wall_s - busy) / steps if steps else float("nan"),
    )
