"""POST /generate_stream: Server-Sent Events, one `data:` event per generated token.

Headers are sent only once the first event is known, so an error that happens before the first
token (validation, overload, a failed prefill) is a normal JSON answer with its status code.
Later errors arrive as a final `data:{"error": ..., "error_type": ...}` event, like TGI.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from router.entry import Entry, ErrorEvent, Event
from router.handlers.common import client_alive, error_response, infer_of, read_json
from router.responses import stream_json

# Comment lines keep idle connections (long queue waits) open through proxies, and a failed
# write is how a vanished client is noticed while nothing else is sent.
KEEP_ALIVE_S = 15.0


async def generate_stream(request: web.Request) -> web.StreamResponse:
    return await stream_payload(request, await read_json(request))


def _sse(data: dict[str, Any]) -> bytes:
    return b"data:" + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


async def _next_event(entry: Entry, response: web.StreamResponse | None) -> Event:
    while True:
        try:
            return await asyncio.wait_for(entry.events.get(), KEEP_ALIVE_S)
        except asyncio.TimeoutError:
            if response is not None:
                await response.write(b":\n\n")


async def stream_payload(request: web.Request, payload: dict[str, Any]) -> web.StreamResponse:
    infer = infer_of(request)
    valid = await infer.validator.validate(payload, stream=True)
    with infer.permit():
        entry = infer.submit(valid, client_alive(request))
        try:
            event = await _next_event(entry, None)
            if isinstance(event, ErrorEvent):
                return error_response(event.error)
            response = web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream; charset=utf-8",
                    "Cache-Control": "no-cache",
                    "X-Accel-Buffering": "no",
                    "x-compute-type": infer.model.device_type or "unknown",
                    "x-compute-characters": str(len(valid.inputs)),
                }
            )
            await response.prepare(request)
            try:
                await _write_events(entry, response, event)
            except ConnectionResetError:
                pass  # the client went away mid-stream; `finally` releases its request
            return response
        finally:
            if not entry.done:
                entry.cancel()  # client gone or handler cancelled: free its blocks next step


async def _write_events(entry: Entry, response: web.StreamResponse, event: Event) -> None:
    index = 0
    while True:
        if isinstance(event, ErrorEvent):
            await response.write(_sse(event.error.to_json()))
            break
        index += 1
        await response.write(
            _sse(stream_json(entry, index, event.token, event.top_tokens, event.end))
        )
        if event.end is not None:
            break
        event = await _next_event(entry, response)
    await response.write_eof()
