"""The aiohttp application: routes, error middleware, and serving until a signal arrives."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from aiohttp import web

from router.api.openapi import document
from router.auth import api_key_middleware
from router.cors import Cors
from router.errors import (
    GenerationError,
    HttpError,
    IncompleteGenerationError,
    InternalError,
    RouterError,
)
from router.handlers.common import GENERATIONS, INFER, error_response
from router.handlers.misc import OPENAPI
from router.http_refusals import RouterRunner, handler_args
from router.infer import Infer
from router.request_ids import add_request_id_header, request_id
from router.routes import ROUTES

log = logging.getLogger(__name__)

# After the shards are lost: how long the failed requests' handlers get to answer.
LOST_FLUSH_S = 0.5

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
GENERATE_PATHS = frozenset(
    {"/", "/generate", "/generate_stream", "/v1/completions", "/v1/chat/completions"}
)
# Failures during generation are counted where they happen, once per request.
COUNTED_BY_SCHEDULER = (GenerationError, IncompleteGenerationError)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure is `{"error", "error_type", "request_id"}` with TGI's status code."""
    metrics = request.app[INFER].metrics
    if request.method == "POST" and request.path in GENERATE_PATHS:
        metrics.requests.inc()
    try:
        return await handler(request)
    except RouterError as err:
        if not isinstance(err, COUNTED_BY_SCHEDULER):
            metrics.request_failed(err.error_type)
        return error_response(request, err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # A 405 keeps aiohttp's Allow header: RFC 9110 requires it, and clients read it.
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return error_response(request, HttpError(exc.status, exc.reason), allow)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        # The exception's text may be anything (paths, library internals): it stays in the log.
        rid = request_id(request)
        log.exception("request %s: unhandled error on %s %s", rid, request.method, request.path)
        return error_response(request, InternalError())


def create_app(infer: Infer) -> web.Application:
    args = infer.args
    cors = Cors(args.cors_allow_origin) if args.cors_allow_origin else None
    # Outermost first: CORS preflights need no key; a missing key is refused before anything
    # is read or counted; then every other failure becomes TGI's JSON error.
    middlewares = [errors_as_json]
    if args.api_key:
        middlewares.insert(0, api_key_middleware(args.api_key))
    if cors is not None:
        middlewares.insert(0, cors.preflight)
    # aiohttp refuses a body of client_max_size bytes or more; the limit itself is allowed.
    app = web.Application(
        middlewares=middlewares,
        client_max_size=args.payload_limit + 1,
        handler_args=handler_args(args),  # header limits: served by RouterRunner they are JSON
    )
    app.on_response_prepare.append(add_request_id_header)
    if cors is not None:
        app.on_response_prepare.append(cors.add_headers)
    app[INFER] = infer
    app[GENERATIONS] = infer.generations
    for route in ROUTES:
        if route.method == "GET":  # and HEAD, as load balancers and uptime checks send it
            app.router.add_get(route.path, route.handler, allow_head=True)
        else:
            app.router.add_route(route.method, route.path, route.handler)
    app[OPENAPI] = document(ROUTES)

    async def start_scheduler(app: web.Application) -> None:
        app[INFER].start()

    async def stop_scheduler(app: web.Application) -> None:
        await app[INFER].stop()

    app.on_startup.append(start_scheduler)
    app.on_cleanup.append(stop_scheduler)
    return app


async def serve(app: web.Application, host: str, port: int) -> str | None:
    """Serves until SIGINT or SIGTERM, then shuts down cleanly; or until the shards are lost
    (router/infer.py), when it returns why, once every client has had its error."""
    # handler_cancellation: a vanished /generate client cancels its handler, so its request
    # is dropped at the next step instead of running to max_new_tokens.
    runner = RouterRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("router listening on http://%s:%d", host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    infer = app[INFER]
    stopped = asyncio.ensure_future(stop.wait())
    lost = asyncio.ensure_future(infer.lost.wait())
    try:
        await asyncio.wait({stopped, lost}, return_when=asyncio.FIRST_COMPLETED)
        if infer.failure is None:
            log.info("shutting down")
            return None
        log.error("stopping: %s", infer.failure)
        # The failed requests' handlers are awake; let them write their errors (a stream's
        # last event) before the connections close.
        await asyncio.sleep(LOST_FLUSH_S)
        return infer.failure
    finally:
        stopped.cancel()
        lost.cancel()
        await runner.cleanup()
