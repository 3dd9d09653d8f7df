"""Helpers shared by the handlers: the app key, JSON bodies, errors, liveness, timing headers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from router.entry import Entry, ErrorEvent, Finished
from router.errors import (
    HttpError,
    PayloadTooLargeError,
    RouterError,
    UnsupportedMediaTypeError,
)
from router.generations import Generations
from router.infer import Infer
from router.request import ValidRequest
from router.request_ids import request_id
from router.validation import parse_json_body

INFER: web.AppKey[Infer] = web.AppKey("infer", Infer)
GENERATIONS: web.AppKey[Generations] = web.AppKey("generations", Generations)


def infer_of(request: web.Request) -> Infer:
    """The whole router, for the introspection routes (/info, /metrics, /v1/models...)."""
    return request.app[INFER]


def generations_of(request: web.Request) -> Generations:
    """All the generation routes may use: validate, permit, submit (router/generations.py)."""
    return request.app[GENERATIONS]


def error_response(
    request: web.Request, err: RouterError, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(err.to_json(request_id(request)), status=err.status, headers=headers)


def is_json(content_type: str) -> bool:
    """application/json, with or without parameters, or a `+json` type (as axum accepts)."""
    return content_type == "application/json" or content_type.endswith("+json")


async def read_json(request: web.Request) -> dict[str, Any]:
    # Checked before the body is read: a form post (curl -d without -H) is a 415, as in TGI.
    if not is_json(request.content_type):
        raise UnsupportedMediaTypeError(request.headers.get("Content-Type"))
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        # aiohttp stops reading at the app's client_max_size (set from --payload-limit).
        raise PayloadTooLargeError(infer_of(request).args.payload_limit) from None
    except web.RequestPayloadError as err:  # e.g. a Content-Encoding the body does not follow
        # Done with the body: aiohttp would otherwise read it again after the answer, and log
        # the same error as an unhandled exception with its traceback.
        request.content.feed_eof()
        cause = err.__cause__  # aiohttp's parser error; its own text is "400, message: ..."
        why = cause.message if isinstance(cause, HttpProcessingError) else "malformed framing"
        raise HttpError(400, f"Bad Request: the body cannot be read: {why}") from None
    return parse_json_body(body)


def client_alive(request: web.Request) -> Callable[[], bool]:
    """A probe the scheduler calls each step: False once the client's connection is closing."""

    def alive() -> bool:
        transport = request.transport
        return transport is not None and not transport.is_closing()

    return alive


def submit(request: web.Request, valid: ValidRequest, received: float | None) -> Entry:
    """Queues a validated request on behalf of this HTTP request (its id, its liveness)."""
    gens = generations_of(request)
    return gens.submit(valid, client_alive(request), received, request_id(request))


async def wait_finished(entry: Entry) -> Finished:
    while True:
        event = await entry.events.get()
        if isinstance(event, ErrorEvent):
            raise event.error
        if event.end is not None:
            return event.end


def timing_headers(gens: Generations, entry: Entry, finished: Finished) -> dict[str, str]:
    """TGI's response headers for a finished request (times in ms, x-compute-time in s)."""
    now = time.monotonic()
    began = entry.started_at if entry.started_at is not None else now
    inference = now - began

    def ms(seconds: float) -> str:
        return str(int(seconds * 1000))

    return {
        "x-compute-type": gens.model.device_type or "unknown",
        "x-compute-time": f"{now - entry.received_at:.6f}",
        "x-compute-characters": str(len(entry.request.inputs)),
        "x-total-time": ms(now - entry.received_at),
        "x-validation-time": ms(entry.queued_at - entry.received_at),
        "x-queue-time": ms(began - entry.queued_at),
        "x-inference-time": ms(inference),
        "x-time-per-token": ms(inference / max(finished.generated_tokens, 1)),
        "x-prompt-tokens": str(entry.request.input_length),
        # Of those, read from the prefix cache instead of computed (router/prefix_cache.py).
        "x-prompt-cached-tokens": str(entry.cached_tokens),
        "x-generated-tokens": str(finished.generated_tokens),
    }
