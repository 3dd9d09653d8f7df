"""--cors-allow-origin: CORS preflights and headers, for browsers calling the API directly.

Without the flag no CORS header is ever sent, so browsers keep pages on other origins out (TGI
allows any origin by default; here it takes `--cors-allow-origin '*'`). Headers go on through
`on_response_prepare`, which also reaches streamed responses whose headers leave before their
handler returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from router.errors import CorsRefusedError
from router.handlers.common import error_response

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ALLOW_METHODS = "GET, POST, OPTIONS"
ALLOW_HEADERS = "Authorization, Content-Type, X-Request-Id"
# Headers a browser script may read: TGI's timing headers and the request id.
EXPOSE_HEADERS = (
    "x-compute-type, x-compute-time, x-compute-characters, x-total-time, x-validation-time, "
    "x-queue-time, x-inference-time, x-time-per-token, x-prompt-tokens, x-generated-tokens, "
    "x-request-id"
)
PREFLIGHT_MAX_AGE_S = 600


class Cors:
    def __init__(self, origins: tuple[str, ...]) -> None:
        self.any = "*" in origins
        self.origins = frozenset(o.rstrip("/") for o in origins)

    def allowed(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for this origin, None when refused."""
        if origin is None:
            return None
        if self.any:
            return "*"
        return origin if origin.rstrip("/") in self.origins else None

    @web.middleware
    async def preflight(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
            return await handler(request)
        allow = self.allowed(request.headers.get("Origin"))
        if allow is None:
            return error_response(request, CorsRefusedError())
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Origin": allow,
                "Access-Control-Allow-Methods": ALLOW_METHODS,
                "Access-Control-Allow-Headers": ALLOW_HEADERS,
                "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
                "Vary": "Origin",
            },
        )

    async def add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        allow = self.allowed(request.headers.get("Origin"))
        if allow is not None and "Access-Control-Allow-Origin" not in response.headers:
            response.headers["Access-Control-Allow-Origin"] = allow
            response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
            response.headers["Vary"] = "Origin"
