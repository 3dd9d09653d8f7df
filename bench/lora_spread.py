"""Which request goes to which adapter, and a concurrency run where each request names its own.

A configuration spreads a level's requests round-robin over its adapters (request i -> adapter
i mod n), or sends them all to the base model. Round-robin keeps every adapter equally loaded,
so at concurrency 16 over 16 adapters about one request per adapter is in flight: the case where
the router's --max-loras admission rule, not the model, limits the batch. The "random" placement
draws each request's adapter uniformly and independently (seeded), as vLLM's benchmark_serving
does with --lora-modules: requests in flight then share adapters more often.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bench.serve_client import Endpoint, Job, new_session, send
from bench.serve_stats import RequestResult


@dataclass(frozen=True)
class SpreadConfig:
    label: str  # "base", "1 adapter", "4 adapters", ...
    adapters: tuple[str, ...]  # empty: the base model

    @property
    def count(self) -> int:
        return len(self.adapters)


def configs(names: Sequence[str], counts: Sequence[int]) -> list[SpreadConfig]:
    """The base model first, then one configuration per count over the first `count` names."""
    out = [SpreadConfig("base", ())]
    for n in counts:
        if not 1 <= n <= len(names):
            raise ValueError(f"cannot spread over {n} adapters: {len(names)} built")
        out.append(SpreadConfig(f"{n} adapter{'s' if n > 1 else ''}", tuple(names[:n])))
    return out


def endpoint_for(base: Endpoint, adapter: str | None) -> Endpoint:
    """OpenAI routes choose the adapter by `model` (the served model name: the base model);
    TGI routes by `parameters.adapter_id`."""
    if adapter is None:
        return base
    if base.api == "openai":
        return replace(base, model=adapter)
    return replace(base, extra_body={**base.extra_body, "adapter_id": adapter})


PLACEMENTS = ("round-robin", "random")


def spread(
    base: Endpoint,
    config: SpreadConfig,
    jobs: Sequence[Job],
    placement: str = "round-robin",
    seed: int = 0,
) -> list[tuple[Endpoint, Job]]:
    if not config.adapters:
        return [(base, job) for job in jobs]
    if placement == "random":
        rng = random.Random(seed)
        return [(endpoint_for(base, rng.choice(config.adapters)), job) for job in jobs]
    if placement != "round-robin":
        raise ValueError(f"placement {placement!r}: one of {', '.join(PLACEMENTS)}")
    n = config.count
    return [(endpoint_for(base, config.adapters[i % n]), job) for i, job in enumerate(jobs)]


async def run_concurrency(
    requests: Sequence[tuple[Endpoint, Job]], concurrency: int
) -> list[RequestResult]:
    """bench.serve_client.run_concurrency with a per-request endpoint: `concurrency` clients,
    each sending the next request in order as soon as its previous one ends."""
    queue = list(reversed(requests))
    results: list[RequestResult] = []
    async with new_session(concurrency) as session:

        async def client() -> None:
            while queue:
                ep, job = queue.pop()
                results.append(await send(session, ep, job))

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return results
