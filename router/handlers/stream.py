"""POST /generate_stream: TGI's Server-Sent Events, one `data:` event per generated token."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from router.api.tgi import parse_generate
from router.entry import Entry, TokenEvent
from router.errors import RouterError
from router.handlers.common import generations_of, read_json, submit
from router.handlers.sse import serve_sse
from router.request import GenerationRequest
from router.responses import stream_json


async def generate_stream(request: web.Request) -> web.StreamResponse:
    received = time.monotonic()
    body = parse_generate(await read_json(request), stream=True)
    return await stream_request(request, body, received)


class TgiStream:
    prefix = b"data:"

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.index = 0

    def on_token(self, index: int, event: TokenEvent) -> list[Any]:
        self.index += 1
        return [stream_json(self.entry, self.index, event.token, event.top_tokens, event.end)]

    def on_error(self, error: RouterError) -> list[Any]:
        return [error.to_json(self.entry.request_id)]

    def on_end(self) -> list[Any]:
        return []


async def stream_request(
    request: web.Request, body: GenerationRequest, received: float | None = None
) -> web.StreamResponse:
    gens = generations_of(request)
    received = time.monotonic() if received is None else received
    valid = await gens.validate(body)
    with gens.permit():
        entry = submit(request, valid, received)
        # As TGI: only what is known before the first token; timings come in /metrics.
        headers = {
            "x-compute-type": gens.model.device_type or "unknown",
            "x-compute-characters": str(len(valid.inputs)),
        }
        return await serve_sse(request, [entry], headers, TgiStream(entry))
