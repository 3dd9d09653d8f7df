"""--api-key: generation routes require `Authorization: Bearer <key>` (401 otherwise).

As in TGI, only the routes that spend compute (and those that change the adapters served) are
guarded; /health, /info, /metrics and /v1/models stay open for probes and scrapers. Unlike TGI
(a case-insensitive string compare), the key is compared with hmac.compare_digest so the time
taken does not reveal how much of a guess matched.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

from router.errors import UnauthorizedError
from router.handlers.common import error_response

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]

PROTECTED_PATHS = frozenset(
    {"/", "/generate", "/generate_stream", "/tokenize", "/v1/completions", "/v1/chat/completions",
     # Runtime LoRA management: whoever may change what the server runs must hold the key.
     "/v1/load_lora_adapter", "/v1/unload_lora_adapter"}
)  # fmt: skip


def authorized(header: str | None, expected: bytes) -> bool:
    if header is None:
        return False
    scheme, _, token = header.strip().partition(" ")
    # The scheme is case-insensitive (RFC 9110); the key is compared exactly.
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected)


def api_key_middleware(api_key: str) -> Middleware:
    expected = api_key.encode()

    @web.middleware
    async def require_api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        # CORS preflights carry no credentials by design; the cors middleware answers them.
        if (
            request.method != "OPTIONS"
            and request.path in PROTECTED_PATHS
            and not authorized(request.headers.get("Authorization"), expected)
        ):
            headers = {"WWW-Authenticate": "Bearer"}
            return error_response(request, UnauthorizedError(), headers)
        return await handler(request)

    return require_api_key
