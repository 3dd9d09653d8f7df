"""GET /openapi.json describes what the handlers accept: every route is listed, and sample
bodies, accepted and refused, get the same verdict from the document's schemas as from the
server (the parsers, and over HTTP for a few)."""

from __future__ import annotations

import itertools

import jsonschema
import pytest

from router.api.parsing import parse
from router.errors import ValidationError
from router.routes import ROUTES
from tests.router.harness import async_test, router_env

HI = [{"role": "user", "content": "Hi"}]
# A minimal accepted body per route with one; each case below changes one field of it.
BASE = {
    "/": {"inputs": "Hello"},
    "/generate": {"inputs": "Hello"},
    "/generate_stream": {"inputs": "Hello"},
    "/tokenize": {"inputs": "Hello"},
    "/v1/completions": {"prompt": "Hello"},
    "/v1/chat/completions": {"messages": HI},
    "/v1/load_lora_adapter": {"lora_name": "a", "lora_path": "/x"},
    "/v1/unload_lora_adapter": {"lora_name": "a"},
}
# Values every field is tried with: types, bounds, neutral and odd values.
VALUES = [None, True, False, 0, 1, -1, 2, 5, 0.0, 0.5, 1.0, 1.5, 2.5, -2.5, 2**64, "", "x",
          "text", "auto", "none", [], ["a"], ["a", "b"], [""], [1], {}, {"type": "text"},
          {"a": 1}]  # fmt: skip


# The server, like TGI's serde, takes an integer only as an integer literal: 1.0 is refused where
# JSON Schema's "integer" would accept it. The document's integers mean literals.
Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, x: isinstance(x, int) and not isinstance(x, bool)
    ),
)


def _schema(doc, route):
    op = doc["paths"][route.path][route.method.lower()]
    body = op["requestBody"]["content"]["application/json"]["schema"]
    return {**body, "components": doc["components"]}


def _accepted_by_parser(route, body) -> bool:
    try:
        parse(route.body, body)
    except ValidationError:
        return False
    return True


def _cases(doc):
    """(route, body) for every top-level field, every GenerateParameters field and every chat
    message field, each with every value of VALUES."""
    params = doc["components"]["schemas"]["GenerateParameters"]["properties"]
    message = doc["components"]["schemas"]["ChatMessage"]["properties"]
    for route in ROUTES:
        if route.body is None:
            continue
        base = BASE[route.path]
        fields = [*doc["components"]["schemas"][route.body.__name__]["properties"], "unknown"]
        for name, value in itertools.product(fields, VALUES):
            yield route, {**base, name: value}
        if "parameters" in fields:
            for name, value in itertools.product([*params, "max_new_token"], VALUES):
                yield route, {**base, "parameters": {name: value}}
        if route.path == "/v1/chat/completions":
            for name, value in itertools.product(message, VALUES):
                yield route, {**base, "messages": [{**HI[0], name: value}]}


@pytest.fixture(scope="module")
def doc():
    from router.api.openapi import document

    return document(ROUTES)


def test_the_schemas_give_the_parsers_verdict_on_every_field(doc):
    wrong, counts = [], {True: 0, False: 0}
    for route, body in _cases(doc):
        by_schema = Validator(_schema(doc, route)).is_valid(body)
        by_parser = _accepted_by_parser(route, body)
        counts[by_parser] += 1
        if by_schema != by_parser:
            wrong.append(f"{route.path} {body}: schema {by_schema}, parser {by_parser}")
    assert not wrong, f"{len(wrong)} disagreements:\n" + "\n".join(wrong[:40])
    assert counts[True] > 300 and counts[False] > 1000  # both verdicts well exercised


@async_test
async def test_openapi_lists_every_route_and_agrees_with_the_server(model_dir):
    async with router_env(model_dir, served_model_name="m") as env:
        r = await env.client.get("/openapi.json")
        assert r.status == 200
        doc = await r.json()
        assert doc["openapi"].startswith("3.")
        jsonschema.Draft202012Validator.check_schema(doc["components"]["schemas"]["ChatRequest"])
        served = {
            (route.method, route.resource.canonical)
            for route in env.client.server.app.router.routes()
            if route.method != "HEAD"  # aiohttp adds HEAD beside every GET
        }
        listed = {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops}
        assert served == listed

        # Over HTTP: accepted bodies are 200s, refused ones 422s naming the field.
        cases = [
            ("/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 2, "seed": None}}),
            ("/generate", {"inputs": "Hi", "parameters": {"top_p": 1.0}}),
            ("/generate", {"inputs": "Hi", "parameters": {"stop": "END"}}),
            ("/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}, "x": 1}),
            ("/v1/completions", {"model": "m", "prompt": ["Hi"], "max_tokens": 2, "stop": "."}),
            ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "echo": True}),
            ("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "tool_choice": "auto"}),
            ("/v1/chat/completions", {"messages": HI, "temperature": 2.5}),
            ("/v1/chat/completions", {"messages": [{"role": "bot", "content": "Hi"}]}),
        ]
        by_path = {r.path: r for r in ROUTES}
        for path, body in cases:
            valid = Validator(_schema(doc, by_path[path])).is_valid(body)
            r = await env.client.post(path, json=body)
            assert r.status == (200 if valid else 422), (path, body, await r.text())
        assert env.violations() == []
