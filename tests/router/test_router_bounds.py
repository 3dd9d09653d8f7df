"""Bounded input everywhere: every size a client controls has a limit, and going past it is a 4xx
JSON error that names the field (or header, or flag) and the limit, never a 5xx nor aiohttp's
plain-text answer. One table over HTTP for the bodies, one over a raw socket for what aiohttp's
HTTP parser refuses before any route runs, and the limits on the command lines."""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace

import pytest

from router import structured
from router.args import parse_args
from tests.router.harness import async_test, router_env

BOUNDS = dict(
    served_model_name="m",
    max_stop_sequence_length=8,
    max_grammar_size=4096,
    max_header_size=1024,
    max_headers=20,
)
GEN, COMP, CHAT = "/generate", "/v1/completions", "/v1/chat/completions"
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
HI = [{"role": "user", "content": "Hi"}]
# A schema of more than 4096 bytes as JSON text.
BIG_SCHEMA = {
    "type": "object",
    "properties": {f"field_{i}": {"type": "integer"} for i in range(200)},
}
CHOICES = [f"choice number {i}" for i in range(300)]  # > 4096 bytes as a grammar


def g(**params):
    return {"inputs": "Hello", "parameters": {"max_new_tokens": 2, **params}}


def c(**fields):
    return {"model": "m", "prompt": "Hello", "max_tokens": 2, **fields}


def ch(**fields):
    return {"model": "m", "messages": HI, "max_tokens": 2, **fields}


# (route, body, status, error_type, substrings the error must contain: the field and the limit)
TABLE = [
    # stop sequences: --max-stop-sequence-length characters each (--max-stop-sequences count)
    (GEN, g(stop=["x" * 9]), 422, "validation", ["`stop`", "at most 8 characters", "Given: 9"]),
    (COMP, c(stop="y" * 9), 422, "validation", ["`stop`", "at most 8 characters", "Given: 9"]),
    (CHAT, ch(stop=["ok", "z" * 20]), 422, "validation", ["`stop`", "at most 8", "Given: 20"]),
    # grammars: --max-grammar-size bytes of text, before llguidance compiles anything
    (
        GEN,
        g(grammar={"type": "regex", "value": "a" * 4097}),
        422,
        "validation",
        ["`parameters.grammar.value`", "at most 4096 bytes as a regex", "Given: 4097"],
    ),
    (
        GEN,
        g(grammar={"type": "json", "value": BIG_SCHEMA}),
        422,
        "validation",
        ["`parameters.grammar.value`", "at most 4096 bytes as JSON text"],
    ),
    (
        CHAT,
        ch(response_format={"type": "json_schema", "json_schema": {"schema": BIG_SCHEMA}}),
        422,
        "validation",
        ["`response_format.json_schema.schema`", "at most 4096 bytes"],
    ),
    (COMP, c(guided_choice=CHOICES), 422, "validation", ["`guided_choice", "at most 4096"]),
    (
        CHAT,
        ch(structured_outputs={"regex": "[a-z]" * 1000}),
        422,
        "validation",
        ["`structured_outputs.regex`", "at most 4096 bytes", "Given: 5000"],
    ),
    # n and best_of: OpenAI's 128, --max-best-of (2), --max-concurrent-requests
    (CHAT, ch(n=129), 422, "validation", ["`n`", "<= 128", "Given: 129"]),
    (COMP, c(best_of=3), 422, "validation", ["`best_of`", "<= 2", "Given: 3"]),
    (GEN, g(best_of=3, do_sample=True), 422, "validation", ["`best_of`", "<= 2", "Given: 3"]),
    # logit_bias: 1024 entries, values in [-100, 100], keys token ids of at most 10 digits
    (
        COMP,
        c(logit_bias={str(i): 1 for i in range(1025)}),
        422,
        "validation",
        ["`logit_bias`", "at most 1024 tokens", "Given: 1025"],
    ),
    (CHAT, ch(logit_bias={"5": -100.5}), 422, "validation", ["`logit_bias`", ">= -100"]),
    (CHAT, ch(logit_bias={"1" * 11: 1}), 422, "validation", ["`logit_bias`", "10 digits"]),
    # Python converts no more than 4300 digits: this was a refusal with its error text
    (CHAT, ch(logit_bias={"7" * 5000: 1}), 422, "validation", ["`logit_bias`", "10 digits"]),
    (CHAT, ch(logit_bias={"511": 1, "512": 1}), 422, "validation", ["[512]", "vocabulary"]),
    # names the server looks up: adapters (256 characters), the model (4096)
    (GEN, g(adapter_id="a" * 257), 422, "validation", ["`adapter_id`", "at most 256", "257"]),
    (CHAT, ch(model="m" * 4097), 422, "validation", ["`model`", "at most 4096", "4097"]),
    (COMP, c(model="m" * 4097), 422, "validation", ["`model`", "at most 4096", "4097"]),
    # runtime adapters: names as above (and printable), paths at most PATH_MAX
    (
        LOAD,
        {"lora_name": "n" * 257, "lora_path": "a"},
        400,
        "invalid_lora_adapter",
        ["`lora_name`", "at most 256 characters", "Given: 257"],
    ),
    (UNLOAD, {"lora_name": "n" * 257}, 400, "invalid_lora_adapter", ["`lora_name`", "256"]),
    (
        LOAD,
        {"lora_name": "a\x1bb", "lora_path": "a"},
        400,
        "invalid_lora_adapter",
        ["`lora_name`", "printable"],
    ),
    (
        LOAD,
        {"lora_name": "ok", "lora_path": "p/" * 2048},
        400,
        "invalid_lora_adapter",
        ["`lora_path`", "at most 4095 bytes", "Given: 4096"],
    ),
]


@pytest.fixture
def lora_dir(tmp_path):
    return os.path.realpath(tmp_path)


async def _error(response) -> tuple[int, dict]:
    assert response.content_type == "application/json", await response.text()
    return response.status, await response.json()


@async_test
async def test_every_bound_is_a_json_4xx_naming_field_and_limit(model_dir, lora_dir):
    runtime = dict(enable_lora_runtime_loading=True, lora_dir=lora_dir)
    async with router_env(model_dir, **BOUNDS, **runtime) as env:
        wrong = []
        for route, body, status, error_type, needles in TABLE:
            got, error = await _error(await env.client.post(route, json=body))
            shown = f"{route} {json.dumps(body)[:80]}"
            if (got, error.get("error_type")) != (status, error_type) or not error["request_id"]:
                wrong.append(f"{shown}: {got} {error}")
                continue
            missing = [n for n in needles if n not in error["error"]]
            if missing:
                wrong.append(f"{shown}: {missing} not in {error['error']!r}")
            if len(error["error"]) > 400:  # the error names the bound, not the whole input
                wrong.append(f"{shown}: the error echoes the input ({len(error['error'])} chars)")
        assert not wrong, "\n".join(wrong)

        # At the bounds, everything is served.
        ok = [
            (GEN, g(stop=["x" * 8], adapter_id="")),
            # 1024 keys for the 512 ids of the tiny vocabulary ("7" and "07" name one token)
            (
                COMP,
                c(stop="y" * 8, logit_bias={f"{i // 512 * '0'}{i % 512}": 1 for i in range(1024)}),
            ),
            (CHAT, ch(logit_bias={"0" * 10: 100, "7": -100})),
            (GEN, g(grammar={"type": "regex", "value": "a" * 4096})),
        ]
        for route, body in ok:
            r = await env.client.post(route, json=body)
            assert r.status == 200, (route, await r.text())
        assert env.violations() == []


@async_test
async def test_llguidance_limits_are_a_422_naming_the_field(model_dir, monkeypatch):
    """Past the size flag, llguidance's own limits still answer: a 422, never a 5xx."""
    too_many = {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(20000)},
    }
    nested = '{"type": "array", "items": ' * 300 + '{"type": "string"}' + "}" * 300
    async with router_env(model_dir, max_grammar_size=1_000_000) as env:
        for grammar, why in (
            ({"type": "json", "value": too_many}, "schema too large"),
            ({"type": "json", "value": nested}, "recursion limit"),
        ):
            status, error = await _error(await env.client.post(GEN, json=g(grammar=grammar)))
            assert (status, error["error_type"]) == (422, "validation"), error
            assert "`parameters.grammar.value` is not valid" in error["error"], error
            assert why in error["error"], error

        # Any other failure of llguidance on a client's grammar is about that grammar too.
        def fails(regex: str) -> None:
            raise RuntimeError("internal")

        matcher = SimpleNamespace(grammar_from_regex=fails)
        monkeypatch.setattr(structured, "llguidance", SimpleNamespace(LLMatcher=matcher))
        body = g(grammar={"type": "regex", "value": "a+"})
        status, error = await _error(await env.client.post(GEN, json=body))
        assert (status, error["error_type"]) == (422, "validation"), error
        assert error["error"].endswith(
            "`parameters.grammar.value` cannot be compiled by llguidance (RuntimeError)"
        )


async def _raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Sends bytes as they are (no client would send these) and reads the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def _get(path: str = "/info", headers: list[str] = ()) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: x", "Connection: close", *headers, "", ""]
    return "\r\n".join(lines).encode()


def _post(body: bytes, headers: list[str]) -> bytes:
    lines = [f"POST {GEN} HTTP/1.1", "Host: x", "Connection: close", *headers]
    lines.append("Content-Type: application/json")
    return "\r\n".join([*lines, "", ""]).encode() + body


# (raw request, status, error_type, what the error must say); BOUNDS: 1024 bytes, 20 headers.
RAW = [
    (_get(headers=[f"X-Big: {'a' * 1025}"]), 431, "header_too_large",
     ["at most 1024 bytes", "--max-header-size"]),
    (_get(headers=[f"X-{'n' * 1100}: 1"]), 431, "header_too_large", ["--max-header-size"]),
    (_get(headers=[f"Cookie: {'c=1; ' * 300}"]), 431, "header_too_large", ["1024 bytes"]),
    (_get(path="/info?" + "q" * 1100), 431, "header_too_large", ["request line"]),
    (_get(headers=[f"X-H{i}: 1" for i in range(19)]), 431, "header_too_large",
     ["at most 20 header fields", "--max-headers"]),
    # Other malformed requests the parser refuses: 400, still JSON.
    (_post(b"zz\r\nabc\r\n0\r\n\r\n", ["Transfer-Encoding: chunked"]), 400, "http",
     ["Bad Request"]),  # then aiohttp's reason, which its C and Python parsers word apart
    (b"GET /info HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, "http", ["Bad Request"]),
    # A body that does not follow its Content-Encoding: read by the handler, a 400 too.
    (_post(b"abcde", ["Content-Encoding: gzip", "Content-Length: 5"]), 400, "http",
     ["the body cannot be read", "content-encoding"]),
]  # fmt: skip


@async_test
async def test_requests_the_http_parser_refuses_are_json_errors(model_dir):
    async with router_env(model_dir, **BOUNDS) as env:
        port = env.client.server.port
        for request, status, error_type, needles in RAW:
            got, headers, body = await _raw(port, request)
            shown = request[:60]
            assert got == status, (shown, got, body[:300])
            assert headers["content-type"].startswith("application/json"), (shown, headers)
            error = json.loads(body)
            assert error["error_type"] == error_type, (shown, error)
            assert error["request_id"] == headers["x-request-id"], (shown, error, headers)
            assert all(n in error["error"] for n in needles), (shown, needles, error)
            assert len(error["error"]) < 400, error  # not an echo of the whole line
        # At the limits: served. (aiohttp's C parser bounds a header's name and value each, its
        # Python parser the whole line, and counts the request line and the blank one as headers.)
        ok = _get(headers=[f"X-Big: {'a' * 1017}", *(f"X-H{i}: 1" for i in range(15))])
        got, _, body = await _raw(port, ok)
        assert got == 200, body[:300]
        # The server keeps serving other connections.
        assert (await env.client.get("/info")).status == 200


@async_test
async def test_debug_steps_since_is_bounded(model_dir):
    async with router_env(model_dir) as env:
        for since in ("1" * 5000, "9" * 19, "²", "-1", "x"):
            r = await env.client.get("/debug/steps", params={"since": since})
            status, error = await _error(r)
            assert status == 422 and "`since`" in error["error"], (since, error)
            assert len(error["error"]) < 200, error
        assert (
            await env.client.get("/debug/steps", params={"since": str(2**63 - 1)})
        ).status == 200


ARGV = ["--model-id", "/m", "--shard-uds-path", "/s"]


def test_the_flags_and_their_defaults():
    a = parse_args(ARGV)
    assert (a.max_stop_sequence_length, a.max_grammar_size) == (1024, 256 * 1024)
    assert (a.max_header_size, a.max_headers) == (8190, 128)
    a = parse_args([*ARGV, "--max-stop-sequence-length", "5", "--max-grammar-size", "9",
                    "--max-header-size", "100", "--max-headers", "7"])  # fmt: skip
    assert (a.max_stop_sequence_length, a.max_grammar_size, a.max_header_size, a.max_headers) == (
        5, 9, 100, 7)  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-grammar-size", "0"],
        ["--max-header-size", "-1"],
        ["--max-headers", "0"],
        ["--max-stop-sequence-length", "0"],
        ["--served-model-name", "m" * 4097],
        ["--lora-adapters", f"{'a' * 257}=/x"],
        ["--lora-adapters", "a\x07b=/x"],
    ],
)
def test_impossible_bounds_and_names_are_refused_at_startup(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args([*ARGV, *argv])
    assert "error" in capsys.readouterr().err
