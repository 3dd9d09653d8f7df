"""POST /generate: one JSON answer when the generation is finished (best_of included)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from typing import Any

from aiohttp import web

from router.entry import Entry, ErrorEvent, Finished
from router.handlers.common import client_alive, infer_of, read_json
from router.infer import Infer
from router.request import ValidRequest
from router.responses import generate_json


async def generate(request: web.Request) -> web.Response:
    return await generate_payload(request, await read_json(request))


async def wait_finished(entry: Entry) -> Finished:
    while True:
        event = await entry.events.get()
        if isinstance(event, ErrorEvent):
            raise event.error
        if event.end is not None:
            return event.end


def _logprob_sum(entry: Entry) -> float:
    return sum(t.logprob for t in entry.tokens if t.logprob is not None)


def _variants(valid: ValidRequest) -> list[ValidRequest]:
    """best_of > 1 runs independent samples, each with its own random seed (as TGI does)."""
    if valid.best_of == 1:
        return [valid]
    return [
        dataclasses.replace(
            valid, sampling=dataclasses.replace(valid.sampling, seed=random.getrandbits(64))
        )
        for _ in range(valid.best_of)
    ]


async def generate_payload(
    request: web.Request, payload: dict[str, Any], *, as_list: bool = False
) -> web.Response:
    """as_list: POST / answers a one-element list, like TGI's api-inference compatible route."""
    started = time.monotonic()
    infer: Infer = infer_of(request)
    valid = await infer.validator.validate(payload, stream=False)
    validated = time.monotonic()
    with infer.permit(valid.best_of):
        entries = [infer.submit(v, client_alive(request)) for v in _variants(valid)]
        try:
            results = await asyncio.gather(*(wait_finished(e) for e in entries))
        finally:
            for entry in entries:
                if not entry.done:
                    entry.cancel()
    ranked = sorted(
        zip(entries, results, strict=True), key=lambda pair: _logprob_sum(pair[0]), reverse=True
    )
    best_entry, best = ranked[0]
    body = generate_json(best_entry, best, ranked[1:] if valid.best_of > 1 else None)
    return web.json_response(
        [body] if as_list else body,
        headers=_timing_headers(infer, best_entry, best, started, validated),
    )


def _timing_headers(
    infer: Infer, entry: Entry, finished: Finished, started: float, validated: float
) -> dict[str, str]:
    now = time.monotonic()
    began = entry.started_at or now
    inference = now - began
    ms = lambda seconds: str(int(seconds * 1000))  # noqa: E731
    return {
        "x-compute-type": infer.model.device_type or "unknown",
        "x-compute-time": f"{now - started:.6f}",
        "x-compute-characters": str(len(entry.request.inputs)),
        "x-total-time": ms(now - started),
        "x-validation-time": ms(validated - started),
        "x-queue-time": ms(began - entry.queued_at),
        "x-inference-time": ms(inference),
        "x-time-per-token": ms(inference / max(finished.generated_tokens, 1)),
        "x-prompt-tokens": str(entry.request.input_length),
        "x-generated-tokens": str(finished.generated_tokens),
    }
