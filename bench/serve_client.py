"""The benchmark's HTTP client: streaming requests to an OpenAI- or TGI-style server (aiohttp).

`openai`: POST /v1/completions with stream=true (text chunks, `usage` on the last chunk when the
server gives it). `tgi`: POST /generate_stream (one event per token, `details` on the last).
`detect_api` prefers /v1/completions and falls back to /generate_stream, saying so.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.serve_stats import RequestResult

# A stream that stays silent this long has stalled (the slowest CPU step is well under it).
READ_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # e.g. http://127.0.0.1:3000
    api: str  # "openai" | "tgi"
    model: str  # OpenAI "model" field
    # Server-specific request fields, e.g. {"ignore_eos": true} or transformers' generation_config.
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    prompt: str
    prompt_tokens: int  # the client's own count (exact by construction)
    max_tokens: int


def new_session(limit: int) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=READ_TIMEOUT_S)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max(limit, 1) + 4), timeout=timeout
    )


async def detect_api(session: aiohttp.ClientSession, base_url: str, model: str, want: str) -> str:
    """`want` is openai, tgi or auto (try /v1/completions, fall back to /generate_stream)."""
    if want != "auto":
        return want
    body = {"model": model, "prompt": "hello", "max_tokens": 1}
    async with session.post(f"{base_url}/v1/completions", json=body) as resp:
        await resp.read()
        if resp.status not in (404, 405):
            return "openai"
        status = resp.status
    async with session.post(
        f"{base_url}/generate_stream", json={"inputs": "hello", "parameters": {"max_new_tokens": 1}}
    ) as resp:
        await resp.read()
        if resp.status in (404, 405):
            raise RuntimeError(f"{base_url} has neither /v1/completions nor /generate_stream")
    print(
        f"NOTE: {base_url} answers HTTP {status} on /v1/completions; falling back to TGI "
        "/generate_stream (no ignore_eos there: output lengths are what the server sent back)",
        flush=True,
    )
    return "tgi"


def request_body(ep: Endpoint, job: Job) -> tuple[str, dict[str, Any]]:
    if ep.api == "openai":
        body = {
            "model": ep.model,
            "prompt": job.prompt,
            "max_tokens": job.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        return "/v1/completions", {**body, **ep.extra_body}
    if ep.api == "tgi":
        params = {"max_new_tokens": job.max_tokens, "details": True}
        return "/generate_stream", {"inputs": job.prompt, "parameters": {**params, **ep.extra_body}}
    raise ValueError(f"unknown api {ep.api!r}")


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """`data:` payloads of a server-sent event stream, parsed; stops at `[DONE]`."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # blank separators, comments (keep-alives), event names
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)


@dataclass
class _Tally:
    """What one stream said, as it arrives."""

    chunk_times: list[float] = field(default_factory=list)
    server_output_tokens: int | None = None
    server_prompt_tokens: int | None = None
    error: str = ""


def _read_openai(event: dict[str, Any], tally: _Tally, now: float) -> None:
    usage = event.get("usage")
    if usage:
        tally.server_output_tokens = usage.get("completion_tokens")
        tally.server_prompt_tokens = usage.get("prompt_tokens")
    for choice in event.get("choices") or []:
        text, finish = choice.get("text"), choice.get("finish_reason")
        # A final chunk with only a finish_reason carries no token; an empty text mid-stream
        # does (a token whose text is held back, e.g. half a UTF-8 character).
        if text or (text is not None and finish is None):
            tally.chunk_times.append(now)


def _read_tgi(event: dict[str, Any], tally: _Tally, now: float) -> None:
    if "token" in event:
        tally.chunk_times.append(now)
    details = event.get("details")
    if details and details.get("generated_tokens") is not None:
        tally.server_output_tokens = details["generated_tokens"]


async def send(session: aiohttp.ClientSession, ep: Endpoint, job: Job) -> RequestResult:
    path, body = request_body(ep, job)
    reader = _read_openai if ep.api == "openai" else _read_tgi
    tally = _Tally()
    start = time.perf_counter()
    try:
        async with session.post(ep.base_url + path, json=body) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                tally.error = f"HTTP {resp.status}: {text}"
            else:
                async for event in sse_events(resp):
                    now = time.perf_counter() - start
                    if "error" in event:
                        tally.error = f"stream error: {str(event['error'])[:300]}"
                        break
                    reader(event, tally, now)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as err:
        tally.error = f"{type(err).__name__}: {err}"
    e2e = time.perf_counter() - start
    if not tally.error and not tally.chunk_times:
        tally.error = "stream ended without a token"
    n_out = tally.server_output_tokens
    return RequestResult(
        ok=not tally.error,
        prompt_tokens=job.prompt_tokens,
        output_tokens=len(tally.chunk_times) if n_out is None else n_out,
        start=start,
        e2e=e2e,
        ttft=tally.chunk_times[0] if tally.chunk_times else None,
        chunk_times=tally.chunk_times,
        error=tally.error,
        server_prompt_tokens=tally.server_prompt_tokens,
    )


async def run_concurrency(
    ep: Endpoint, jobs: Sequence[Job], concurrency: int
) -> list[RequestResult]:
    """`concurrency` clients, each sending its next request as soon as the previous one ends."""
    queue = list(reversed(jobs))
    results: list[RequestResult] = []
    async with new_session(concurrency) as session:

        async def client() -> None:
            while queue:
                results.append(await send(session, ep, queue.pop()))

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return results


async def run_rate(
    ep: Endpoint, jobs: Sequence[Job], rate: float, max_concurrency: int | None, seed: int
) -> list[RequestResult]:
    """Poisson arrivals at `rate` requests/s (exponential gaps), optionally capped in flight."""
    rng = random.Random(seed)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    async with new_session(max_concurrency or len(jobs)) as session:

        async def one(job: Job) -> RequestResult:
            if limit is None:
                return await send(session, ep, job)
            async with limit:
                return await send(session, ep, job)

        tasks = []
        for i, job in enumerate(jobs):
            if i:
                await asyncio.sleep(rng.expovariate(rate))
            tasks.append(asyncio.ensure_future(one(job)))
        return list(await asyncio.gather(*tasks))
