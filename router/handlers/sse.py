"""Server-Sent Events for one request's entries (one, or one per OpenAI choice), shared by TGI's
/generate_stream and the OpenAI streams.

Headers are sent only once the first event is known, so an error that happens before the first
token (overload, a failed prefill) is a normal JSON answer with its status code. Later errors
arrive as a final `data:{"error": ..., "error_type": ...}` event, like TGI. What each event looks
like on the wire is the renderer's business; this module owns the connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, Protocol

from aiohttp import web

from router.entry import Entry, ErrorEvent, Event, TokenEvent
from router.errors import RouterError
from router.handlers.common import error_response

# Comment lines keep idle connections (long queue waits) open through proxies, and a failed
# write is how a vanished client is noticed while nothing else is sent.
KEEP_ALIVE_S = 15.0
SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
# A payload that is sent as is, not as JSON (OpenAI's `data: [DONE]`).
Raw = str


class SseRenderer(Protocol):
    """Turns entries' events into SSE payloads (JSON-able objects, or raw strings)."""

    prefix: bytes  # TGI writes `data:`, OpenAI `data: `; clients accept both

    def on_token(self, index: int, event: TokenEvent) -> list[Any]:
        """The event of the index-th entry (an OpenAI choice); its last one carries `end`."""
        ...

    def on_error(self, error: RouterError) -> list[Any]: ...

    def on_end(self) -> list[Any]:
        """After every entry's last event."""
        ...


def encode(prefix: bytes, payload: Any) -> bytes:
    data = payload if isinstance(payload, Raw) else json.dumps(payload, ensure_ascii=False)
    return prefix + data.encode() + b"\n\n"


class EntryEvents:
    """The entries' events as (entry index, event), in the order they arrive, until every entry
    has ended or one has failed. One entry is read directly; several are merged by a forwarding
    task each, which `close` stops."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.entries = entries
        self.open = len(entries)
        self._merged: asyncio.Queue[tuple[int, Event]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        if len(entries) > 1:
            self._merged = asyncio.Queue()
            self._tasks = [asyncio.create_task(self._forward(i, e)) for i, e in enumerate(entries)]

    async def _forward(self, index: int, entry: Entry) -> None:
        assert self._merged is not None
        while True:
            event = await entry.events.get()
            self._merged.put_nowait((index, event))
            if isinstance(event, ErrorEvent) or event.end is not None:
                return

    async def _get(self) -> tuple[int, Event]:
        if self._merged is None:
            return 0, await self.entries[0].events.get()
        return await self._merged.get()

    async def next(self, response: web.StreamResponse | None) -> tuple[int, Event]:
        """The next event; while none comes, a keep-alive comment to `response` if given."""
        while True:
            try:
                index, event = await asyncio.wait_for(self._get(), KEEP_ALIVE_S)
            except asyncio.TimeoutError:
                if response is not None:
                    await response.write(b":\n\n")
                continue
            if isinstance(event, TokenEvent) and event.end is not None:
                self.open -= 1
            return index, event

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for entry in self.entries:
            if not entry.done:
                entry.cancel()  # client gone, a sibling failed, or handler cancelled


async def serve_sse(
    request: web.Request,
    entries: Sequence[Entry],
    headers: dict[str, str],
    renderer: SseRenderer,
) -> web.StreamResponse:
    """Streams the entries (one per OpenAI choice) to the client; the caller holds the
    concurrency permit around it. A failure of any entry ends the stream."""
    events = EntryEvents(entries)
    try:
        index, event = await events.next(None)
        if isinstance(event, ErrorEvent):
            return error_response(request, event.error)
        response = web.StreamResponse(headers={**SSE_HEADERS, **headers})
        await response.prepare(request)
        try:
            await _pump(events, response, index, event, renderer)
        except ConnectionResetError:
            pass  # the client went away mid-stream; `finally` releases its requests
        return response
    finally:
        events.close()  # free their blocks next step


async def _pump(
    events: EntryEvents,
    response: web.StreamResponse,
    index: int,
    event: Event,
    renderer: SseRenderer,
) -> None:
    while True:
        if isinstance(event, ErrorEvent):
            payloads = renderer.on_error(event.error)
        else:
            payloads = renderer.on_token(index, event)
            if events.open == 0:
                payloads += renderer.on_end()
        if payloads:
            await response.write(b"".join(encode(renderer.prefix, p) for p in payloads))
        if isinstance(event, ErrorEvent) or events.open == 0:
            break
        index, event = await events.next(response)
    await response.write_eof()
