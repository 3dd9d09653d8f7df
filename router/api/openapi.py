"""GET /openapi.json: an OpenAPI 3.1 document of every route, generated from the same pydantic
declarations the handlers parse with (TGI publishes one at the same path)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

import router

REF = "#/components/schemas/{model}"
ERROR = {
    "type": "object",
    "properties": {
        "error": {"type": "string"},
        "error_type": {"type": "string"},
        "request_id": {"type": "string"},
    },
    "required": ["error", "error_type"],
}
# What a failure may answer on any route (router/errors.py); the body is always ERROR.
ERRORS = {
    "400": "Malformed HTTP: a body that does not follow its Content-Encoding or framing",
    "401": "--api-key is set and the request does not carry it",
    "404": "Unknown route, model or adapter",
    "413": "Body larger than --payload-limit",
    "415": "Body not sent as JSON",
    "422": "A field fails validation; the message names it as sent, and the limit",
    "424": "A shard failed during generation",
    "429": "More than --max-concurrent-requests in flight",
    "431": "The request line or a header longer than --max-header-size bytes, or more header "
    "fields than --max-headers",
    "500": "Internal error; the server log has it under the request id",
}
# What only some routes answer (Route.errors names them).
ROUTE_ERRORS = {
    "400": "The adapter cannot be loaded or unloaded: a bad name or path, a name in use, or "
    "the shards' refusal",
    "503": "A shard does not answer",
}


class RouteLike(Protocol):
    method: str
    path: str
    summary: str
    tag: str
    body: type[BaseModel] | None
    answers: tuple[str, ...]
    query: tuple[dict[str, Any], ...]
    errors: tuple[str, ...]


def document(routes: Iterable[RouteLike]) -> dict[str, Any]:
    routes = list(routes)
    bodies = sorted({r.body for r in routes if r.body is not None}, key=lambda m: m.__name__)
    refs, defs = models_json_schema([(m, "validation") for m in bodies], ref_template=REF)
    schemas = {**defs.get("$defs", {}), "Error": ERROR}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        op: dict[str, Any] = {
            "summary": route.summary,
            "tags": [route.tag],
            "operationId": route.handler.__name__,  # type: ignore[attr-defined]
            "responses": _responses(route),
        }
        if route.body is not None:
            schema = refs[(route.body, "validation")]
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema}},
            }
        if route.query:
            op["parameters"] = list(route.query)
        paths.setdefault(route.path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Switchyard", "version": router.__version__},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _responses(route: RouteLike) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK"}
    if route.answers:
        ok["content"] = {media: {} for media in route.answers}
    error = {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}
    out = {"200": ok}
    for status, why in ERRORS.items():
        out[status] = {"description": why, "content": error}
    for status in route.errors:
        out[status] = {"description": ROUTE_ERRORS[status], "content": error}
    return dict(sorted(out.items()))
