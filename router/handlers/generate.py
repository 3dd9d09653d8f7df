"""POST /generate: one JSON answer when the generation is finished (best_of included)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time

from aiohttp import web

from router.api.tgi import parse_generate
from router.entry import Entry
from router.generations import Generations
from router.handlers.common import (
    generations_of,
    read_json,
    submit,
    timing_headers,
    wait_finished,
)
from router.request import GenerationRequest, ValidRequest
from router.responses import generate_json


async def generate(request: web.Request) -> web.Response:
    received = time.monotonic()
    body = parse_generate(await read_json(request), stream=False)
    return await generate_request(request, body, received=received)


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


async def generate_request(
    request: web.Request,
    body: GenerationRequest,
    *,
    as_list: bool = False,
    received: float | None = None,
) -> web.Response:
    """as_list: POST / answers a one-element list, like TGI's api-inference compatible route."""
    received = time.monotonic() if received is None else received
    gens: Generations = generations_of(request)
    valid = await gens.validate(body)
    with gens.permit(valid.best_of):
        entries = [submit(request, v, received) for v in _variants(valid)]
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
        [body] if as_list else body, headers=timing_headers(gens, best_entry, best)
    )
