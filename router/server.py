"""The aiohttp application: routes, error middleware, and serving until a signal arrives."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from aiohttp import web

from router.errors import GenerationError, IncompleteGenerationError, RouterError
from router.handlers.common import INFER, error_response
from router.handlers.generate import generate
from router.handlers.misc import compat_generate, health, info, metrics, tokenize
from router.handlers.stream import generate_stream
from router.infer import Infer

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
GENERATE_PATHS = frozenset({"/", "/generate", "/generate_stream"})
# Failures during generation are counted where they happen, once per request.
COUNTED_BY_SCHEDULER = (GenerationError, IncompleteGenerationError)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure is `{"error", "error_type"}` with TGI's status code."""
    metrics = request.app[INFER].metrics
    if request.method == "POST" and request.path in GENERATE_PATHS:
        metrics.requests += 1
    try:
        return await handler(request)
    except RouterError as err:
        if not isinstance(err, COUNTED_BY_SCHEDULER):
            metrics.failures[err.error_type] += 1
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason, "error_type": "http"}, status=exc.status)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as err:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return web.json_response({"error": str(err), "error_type": "internal"}, status=500)


def create_app(infer: Infer) -> web.Application:
    # Prompts can be long: allow large bodies (the token limits are the real bound).
    app = web.Application(middlewares=[errors_as_json], client_max_size=64 * 1024 * 1024)
    app[INFER] = infer
    app.router.add_post("/", compat_generate)
    app.router.add_post("/generate", generate)
    app.router.add_post("/generate_stream", generate_stream)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/info", info)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)

    async def start_scheduler(app: web.Application) -> None:
        app[INFER].start()

    async def stop_scheduler(app: web.Application) -> None:
        await app[INFER].stop()

    app.on_startup.append(start_scheduler)
    app.on_cleanup.append(stop_scheduler)
    return app


async def serve(app: web.Application, host: str, port: int) -> None:
    """Serves until SIGINT or SIGTERM, then shuts down cleanly."""
    # handler_cancellation: a vanished /generate client cancels its handler, so its request
    # is dropped at the next step instead of running to max_new_tokens.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("router listening on http://%s:%d", host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("shutting down")
    finally:
        await runner.cleanup()
