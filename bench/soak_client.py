"""The soak's HTTP client: sends one SoakRequest, reads its answer to the end (or drops a
stream where the request says), and says what went wrong, if anything. Nothing is retried:
every status, every error event and every short stream is an outcome to count."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.soak_requests import SoakRequest, output_problem

# One answer of a short generation taking this long is a hang, not a slow server.
REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Outcome:
    index: int
    kind: str
    status: int | None  # None: no HTTP answer at all (connection refused or reset, timeout)
    latency_s: float  # send to last byte (to the drop, for a dropped stream)
    dropped: bool = False  # the client went away on purpose, mid-stream
    error: str = ""  # "" when the answer is what it should be
    error_type: str = ""  # the server's `error_type` on a non-200 JSON answer
    features: tuple[str, ...] = ()  # the request's (SoakRequest.features), for the report

    @property
    def completed(self) -> bool:
        return self.status == 200 and not self.error and not self.dropped


def new_session(connections: int) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, sock_connect=30)
    # force_close: a dropped stream's connection is closed, never handed to the next request.
    connector = aiohttp.TCPConnector(limit=connections + 4, force_close=True)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


async def send(session: aiohttp.ClientSession, base_url: str, req: SoakRequest) -> Outcome:
    t0 = time.monotonic()
    try:
        async with session.post(base_url + req.path, json=req.body) as resp:
            if resp.status != 200:
                return await _refusal(req, resp, t0)
            if req.stream:
                return await _read_stream(req, resp, t0)
            return _judge(req, t0, *_choices(req, await resp.json()))
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as err:
        return Outcome(req.index, req.kind, None, time.monotonic() - t0, error=repr(err))


async def _refusal(req: SoakRequest, resp: aiohttp.ClientResponse, t0: float) -> Outcome:
    text = await resp.text()
    try:
        error_type = str(json.loads(text).get("error_type", ""))
    except (ValueError, AttributeError):
        error_type = ""
    return Outcome(
        req.index,
        req.kind,
        resp.status,
        time.monotonic() - t0,
        error=f"HTTP {resp.status}: {text[:300]}",
        error_type=error_type,
    )


def _judge(
    req: SoakRequest, t0: float, texts: list[str], finishes: list[str], last_piece: str = ""
) -> Outcome:
    problem = output_problem(req, texts, finishes, last_piece)
    return Outcome(req.index, req.kind, 200, time.monotonic() - t0, error=problem)


def _choices(req: SoakRequest, body: dict[str, Any]) -> tuple[list[str], list[str], str]:
    """Texts and finish reasons of a non-streamed answer, in choice order; TGI's last token's
    text."""
    if req.api == "tgi":
        details = body["details"]
        last = details["tokens"][-1]["text"] if details["tokens"] else ""
        return [body["generated_text"]], [details["finish_reason"]], last
    choices = sorted(body["choices"], key=lambda c: c["index"])
    texts = [(c["message"]["content"] or "") if "message" in c else c["text"] for c in choices]
    return texts, [c.get("finish_reason") or "" for c in choices], ""


async def _read_stream(req: SoakRequest, resp: aiohttp.ClientResponse, t0: float) -> Outcome:
    content_type = resp.headers.get("Content-Type", "")
    if not content_type.startswith("text/event-stream"):
        return Outcome(req.index, req.kind, 200, 0.0, error=f"a stream sent as {content_type!r}")
    texts: dict[int, list[str]] = {}
    finishes: dict[int, str] = {}
    events, ended, last_piece = 0, False, ""
    async for raw in resp.content:
        if req.drop_after is not None and events >= req.drop_after:
            resp.close()  # the client goes away: the server must cancel and free the request
            return Outcome(req.index, req.kind, 200, time.monotonic() - t0, dropped=True)
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # separators and keep-alive comments
        data = line[5:].strip()
        if data == b"[DONE]":
            ended = True
            break
        event = json.loads(data)
        events += 1
        if "error" in event:
            return Outcome(
                req.index, req.kind, 200, time.monotonic() - t0, error=f"error event: {event}"
            )
        if req.api == "tgi":
            last_piece = (event.get("token") or {}).get("text", "")
            if event.get("generated_text") is not None:  # TGI's last event
                texts[0] = [event["generated_text"]]
                finishes[0] = event["details"]["finish_reason"]
                ended = True
            continue
        for choice in event.get("choices") or []:
            i = choice["index"]
            piece = choice["delta"].get("content") if "delta" in choice else choice.get("text")
            texts.setdefault(i, []).append(piece or "")
            if choice.get("finish_reason"):
                finishes[i] = choice["finish_reason"]
    if not ended:
        error = "the stream ended before its last event"
        return Outcome(req.index, req.kind, 200, time.monotonic() - t0, error=error)
    order = sorted(texts)
    joined = ["".join(texts[i]) for i in order]
    return _judge(req, t0, joined, [finishes.get(i, "") for i in order], last_piece)


async def run_all(
    base_url: str,
    reqs: Sequence[SoakRequest],
    concurrency: int,
    on_done: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Every request, `concurrency` in flight at a time (each worker sends its next as soon as
    one is answered); outcomes in request order."""
    pending = iter(reqs)
    out: list[Outcome] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        for req in pending:  # one shared iterator: each request goes to one worker
            outcome = dataclasses.replace(await send(session, base_url, req), features=req.features)
            out.append(outcome)
            if on_done is not None:
                on_done(outcome)

    async with new_session(concurrency) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return sorted(out, key=lambda o: o.index)
