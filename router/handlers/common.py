"""Helpers shared by the handlers: the app key, JSON bodies, errors, client liveness."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from router.errors import RouterError
from router.infer import Infer
from router.validation import parse_json_body

INFER: web.AppKey[Infer] = web.AppKey("infer", Infer)


def infer_of(request: web.Request) -> Infer:
    return request.app[INFER]


def error_response(err: RouterError, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(err.to_json(), status=err.status, headers=headers)


async def read_json(request: web.Request) -> dict[str, Any]:
    return parse_json_body(await request.read())


def client_alive(request: web.Request) -> Callable[[], bool]:
    """A probe the scheduler calls each step: False once the client's connection is closing."""

    def alive() -> bool:
        transport = request.transport
        return transport is not None and not transport.is_closing()

    return alive
