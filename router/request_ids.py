"""Request ids: one per HTTP request, sent back in the `x-request-id` header and in every error
body, and written in the router's log lines about that request, so that what a client reports
can be found in the log.

A client, or a proxy in front of the router, may choose the id by sending `X-Request-Id` (as
with vLLM and OpenAI's API); anything that could garble a log line gets a fresh id instead.
"""

from __future__ import annotations

import re
import uuid

from aiohttp import web

HEADER = "X-Request-Id"
_KEY: web.RequestKey[str] = web.RequestKey("request_id", str)
# What ids from load balancers and tracing systems look like; no spaces, quotes or newlines.
_ACCEPTED = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


def request_id(request: web.Request) -> str:
    """This request's id, fixed on first use."""
    rid = request.get(_KEY)
    if rid is None:
        given = request.headers.get(HEADER, "")
        rid = given if _ACCEPTED.fullmatch(given) else uuid.uuid4().hex
        request[_KEY] = rid
    return rid


async def add_request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: reaches streamed responses too, whose headers leave early."""
    response.headers[HEADER] = request_id(request)
