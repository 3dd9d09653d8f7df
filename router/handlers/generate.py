"""POST /generate: one JSON answer when the generation is finished (best_of included)."""

from __future__ import annotations

import time

from aiohttp import web

from router.api.tgi import parse_generate
from router.generations import Generations
from router.handlers.choices import logprob_sum, submit_all
from router.handlers.common import (
    generations_of,
    read_json,
    timing_headers,
)
from router.request import GenerationRequest
from router.responses import generate_json


async def generate(request: web.Request) -> web.Response:
    received = time.monotonic()
    body = parse_generate(await read_json(request), stream=False)
    return await generate_request(request, body, received=received)


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
        # TGI refuses a seed with best_of: the validator drew one, each candidate adds its index.
        sent = submit_all(request, [valid], valid.best_of, received)
        finished = await sent.finished()
    ranked = sorted(sent.entries, key=logprob_sum, reverse=True)
    best = ranked[0]
    others = [(e, finished[e.id]) for e in ranked[1:]] if valid.best_of > 1 else None
    body = generate_json(best, finished[best.id], others)
    return web.json_response(
        [body] if as_list else body, headers=timing_headers(gens, best, finished[best.id])
    )
