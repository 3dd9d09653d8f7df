"""Server-Sent Events for one entry, shared by TGI's /generate_stream and the OpenAI streams.

Headers are sent only once the first event is known, so an error that happens before the first
token (overload, a failed prefill) is a normal JSON answer with its status code. Later errors
arrive as a final `data:{"error": ..., "error_type": ...}` event, like TGI. What each event looks
like on the wire is the renderer's business; this module owns the connection.
"""

from __future__ import annotations

import asyncio
import json
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
    """Turns an entry's events into SSE payloads (JSON-able objects, or raw strings)."""

    prefix: bytes  # TGI writes `data:`, OpenAI `data: `; clients accept both

    def on_token(self, event: TokenEvent) -> list[Any]: ...

    def on_error(self, error: RouterError) -> list[Any]: ...

    def on_end(self) -> list[Any]: ...


def encode(prefix: bytes, payload: Any) -> bytes:
    data = payload if isinstance(payload, Raw) else json.dumps(payload, ensure_ascii=False)
    return prefix + data.encode() + b"\n\n"


async def next_event(entry: Entry, response: web.StreamResponse | None) -> Event:
    while True:
        try:
            return await asyncio.wait_for(entry.events.get(), KEEP_ALIVE_S)
        except asyncio.TimeoutError:
            if response is not None:
                await response.write(b":\n\n")


async def serve_sse(
    request: web.Request, entry: Entry, headers: dict[str, str], renderer: SseRenderer
) -> web.StreamResponse:
    """Streams the entry to the client; the caller holds the concurrency permit around it."""
    try:
        event = await next_event(entry, None)
        if isinstance(event, ErrorEvent):
            return error_response(request, event.error)
        response = web.StreamResponse(headers={**SSE_HEADERS, **headers})
        await response.prepare(request)
        try:
            await _pump(entry, response, event, renderer)
        except ConnectionResetError:
            pass  # the client went away mid-stream; `finally` releases its request
        return response
    finally:
        if not entry.done:
            entry.cancel()  # client gone or handler cancelled: free its blocks next step


async def _pump(
    entry: Entry, response: web.StreamResponse, event: Event, renderer: SseRenderer
) -> None:
    while True:
        if isinstance(event, ErrorEvent):
            payloads = renderer.on_error(event.error)
        else:
            payloads = renderer.on_token(event)
            if event.end is not None:
                payloads += renderer.on_end()
        if payloads:
            await response.write(b"".join(encode(renderer.prefix, p) for p in payloads))
        if isinstance(event, ErrorEvent) or event.end is not None:
            break
        event = await next_event(entry, response)
    await response.write_eof()
