"""Requests aiohttp's HTTP parser refuses, answered as JSON errors like every other refusal.

The parser bounds the request line and each header field (--max-header-size: aiohttp's C parser
applies it to a header's name and value each, its pure-Python one to the whole line) and the
number of header fields (--max-headers), and refuses malformed framing (a bad chunk size...),
before any route or middleware runs: aiohttp then answers a text/plain 400 that echoes the start
of the offending line, and logs a traceback per request, which any client can provoke. Here the
header limits are a 431 (RFC 6585, Request Header Fields Too Large) naming the flag, anything
else a 400, both in the `{"error", "error_type", "request_id"}` body, logged in one line.

aiohttp builds that answer in `RequestHandler.handle_error`, the connection's protocol object,
which only a `web.Server` creates; `RouterRunner` is the AppRunner whose server creates ours.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

from router.args import RouterArgs
from router.errors import HeaderTooLargeError, HttpError, RouterError
from router.request_ids import HEADER, request_id

log = logging.getLogger(__name__)

# aiohttp's text for max_headers (the same in its C and Python parsers).
TOO_MANY_HEADERS = "Too many headers received"
# Of aiohttp's own message, which quotes the client's bytes: enough to see what was wrong.
MAX_DETAIL_CHARS = 200


def handler_args(args: RouterArgs) -> dict[str, int]:
    """web.Application's handler_args: the parser's limits."""
    return {
        "max_line_size": args.max_header_size,  # the request line
        "max_field_size": args.max_header_size,  # a header field
        "max_headers": args.max_headers,
    }


def refusal(exc: HttpProcessingError, max_header_size: int, max_headers: int) -> RouterError:
    if isinstance(exc, LineTooLong):
        return HeaderTooLargeError(
            "Request header fields too large: the request line and each header field may be "
            f"at most {max_header_size} bytes (--max-header-size)"
        )
    if exc.message == TOO_MANY_HEADERS:
        return HeaderTooLargeError(
            f"Request header fields too large: at most {max_headers} header fields are allowed "
            "(--max-headers)"
        )
    return HttpError(exc.code or 400, f"Bad Request: {_short(exc.message)}")


def _short(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS] + "..."


class _JsonRefusals(RequestHandler):
    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # Anything else (an exception past the app's error middleware) keeps aiohttp's answer.
        if not isinstance(exc, HttpProcessingError) or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        err = refusal(exc, self.max_field_size, self.max_headers)
        rid = request_id(request)  # type: ignore[arg-type]  # a fresh one: no header was read
        # A client sending TLS or garbage to the port is common: aiohttp logs it at debug too.
        level = logging.DEBUG if isinstance(exc, BadHttpMethod) else logging.INFO
        log.log(level, "request %s refused by the HTTP parser: %s", rid, _short(exc.message))
        response = web.json_response(err.to_json(rid), status=err.status, headers={HEADER: rid})
        response.force_close()  # the rest of the stream cannot be parsed
        return response


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonRefusals(self, loop=self._loop, **self._kwargs)


class RouterRunner(web.AppRunner):
    """web.AppRunner whose connections answer the parser's refusals as JSON errors."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # the app's startup, and its handler_args
        return _Server(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=asyncio.get_running_loop(),
            **made._kwargs,
        )
