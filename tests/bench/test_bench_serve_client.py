"""The benchmark client against in-process fake servers: what it counts, not how fast."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.serve_client import (
    Endpoint,
    Job,
    detect_api,
    new_session,
    run_concurrency,
    run_rate,
    send,
)


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def openai_stream(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body.get("ignore_eos") is not True:
        return web.json_response({"error": "want ignore_eos"}, status=422)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b": keep-alive comment\n\n")
    texts = ["a", "", " b", "c"]  # an empty text mid-stream is still a token
    for text in texts:
        await resp.write(_sse({"choices": [{"index": 0, "text": text, "finish_reason": None}]}))
    # Two events in one write, as servers that coalesce send them.
    final = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}}
    await resp.write(_sse(final) + _sse(usage) + b"data: [DONE]\n\n")
    return resp


async def tgi_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    n = (await request.json())["parameters"]["max_new_tokens"]
    for i in range(n):
        event = {"token": {"id": i, "text": "x", "special": False}, "generated_text": None}
        if i == n - 1:
            event["details"] = {"generated_tokens": n, "finish_reason": "length"}
        await resp.write(_sse(event))
    return resp


async def failing_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_sse({"choices": [{"index": 0, "text": "a", "finish_reason": None}]}))
    await resp.write(_sse({"error": "shard died", "error_type": "generation"}))
    return resp


def app(with_openai: bool = True) -> web.Application:
    a = web.Application()
    if with_openai:
        a.router.add_post("/v1/completions", openai_stream)
    a.router.add_post("/generate_stream", tgi_stream)
    a.router.add_post("/broken/v1/completions", failing_stream)
    return a


def run(coro_fn, application: web.Application):
    async def main():
        server = TestServer(application)
        await server.start_server()
        try:
            return await coro_fn(str(server.make_url("")).rstrip("/"))
        finally:
            await server.close()

    return asyncio.run(main())


JOB = Job(prompt="p", prompt_tokens=7, max_tokens=4)


def test_openai_stream_counts_tokens_and_usage():
    async def go(url):
        async with new_session(1) as s:
            return await send(s, Endpoint(url, "openai", "m", {"ignore_eos": True}), JOB)

    r = run(go, app())
    assert r.ok, r.error
    assert r.chunks == 4  # the finish-only chunk and the usage chunk carry no token
    assert r.output_tokens == 4 and r.server_prompt_tokens == 7
    assert r.ttft == r.chunk_times[0] and r.e2e >= r.chunk_times[-1]


def test_http_error_is_a_failed_request_with_the_message():
    async def go(url):
        async with new_session(1) as s:
            return await send(s, Endpoint(url, "openai", "m", {}), JOB)

    r = run(go, app())
    assert not r.ok and "422" in r.error and "ignore_eos" in r.error


def test_error_event_mid_stream_fails_the_request():
    async def go(url):
        async with new_session(1) as s:
            return await send(s, Endpoint(url + "/broken", "openai", "m", {}), JOB)

    r = run(go, app())
    assert not r.ok and "shard died" in r.error


def test_tgi_stream_and_fallback_detection():
    async def go(url):
        async with new_session(1) as s:
            api = await detect_api(s, url, "m", "auto")
            result = await send(s, Endpoint(url, api, "m", {}), JOB)
        return api, result

    api, r = run(go, app(with_openai=False))
    assert api == "tgi"
    assert r.ok and r.chunks == 4 and r.output_tokens == 4


def test_detect_prefers_openai():
    async def go(url):
        async with new_session(1) as s:
            return await detect_api(s, url, "m", "auto")

    assert run(go, app()) == "openai"


def test_concurrency_and_rate_runs_send_every_job():
    jobs = [Job(f"p{i}", 7, 3) for i in range(6)]

    async def go(url):
        ep = Endpoint(url, "tgi", "m", {})
        return await run_concurrency(ep, jobs, 4), await run_rate(ep, jobs, 1000.0, 2, seed=0)

    by_clients, by_rate = run(go, app())
    for results in (by_clients, by_rate):
        assert len(results) == 6 and all(r.ok and r.output_tokens == 3 for r in results)
