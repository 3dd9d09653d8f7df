"""Errors carry a request id: in the `x-request-id` header, in every error body (streamed or
not), and in the log lines that hold what the client is not told."""

import re

from tests.router.harness import async_test, parse_sse, router_env

HEX_ID = re.compile(r"[0-9a-f]{32}")


def gen(inputs="H", **params):
    return {"inputs": inputs, "parameters": params}


@async_test
async def test_every_response_has_a_request_id_and_a_client_may_choose_it(model_dir):
    async with router_env(model_dir) as env:
        r = await env.client.post("/generate", json=gen(max_new_tokens=2))
        first = r.headers["x-request-id"]
        assert r.status == 200 and HEX_ID.fullmatch(first)
        r = await env.client.get("/health")
        assert HEX_ID.fullmatch(r.headers["x-request-id"]) and r.headers["x-request-id"] != first

        # A proxy's id is kept, so its logs and the router's line up.
        r = await env.client.post(
            "/generate", json=gen(top_k=0), headers={"X-Request-Id": "lb-7f3a:42"}
        )
        assert r.status == 422 and r.headers["x-request-id"] == "lb-7f3a:42"
        assert (await r.json())["request_id"] == "lb-7f3a:42"
        # One that could garble a log line is replaced.
        r = await env.client.post(
            "/generate", json=gen(top_k=0), headers={"X-Request-Id": 'a b" c'}
        )
        rid = r.headers["x-request-id"]
        assert HEX_ID.fullmatch(rid) and (await r.json())["request_id"] == rid


@async_test
async def test_unexpected_exception_is_a_500_that_keeps_its_text_in_the_log(model_dir, caplog):
    async with router_env(model_dir) as env:

        async def broken(*_args, **_kwargs):
            raise KeyError("/home/deploy/secret/tokenizer.json")

        env.infer.validator.validate = broken
        r = await env.client.post("/generate", json=gen(max_new_tokens=2))
        assert r.status == 500
        rid = r.headers["x-request-id"]
        assert await r.json() == {
            "error": "Internal server error; the server log has the details",
            "error_type": "internal",
            "request_id": rid,
        }
        records = [rec for rec in caplog.records if rid in rec.getMessage()]
        assert records and "secret/tokenizer.json" in str(records[0].exc_info[1])


@async_test
async def test_openai_stream_error_event_names_the_request(model_dir, caplog):
    async with router_env(model_dir) as env:
        env.shards[0].fail_next_decode = True
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": True}
        r = await env.client.post("/v1/chat/completions", json=body)
        assert r.status == 200
        events = parse_sse((await r.text()).replace("data: [DONE]", ""))
        rid = r.headers["x-request-id"]
        assert events[-1] == {
            "error": "Request failed during generation: Decode failed on shard 0 "
            "(the server log has the details under this request_id)",
            "error_type": "generation",
            "request_id": rid,
        }
        logged = [rec.getMessage() for rec in caplog.records]
        assert any(rid in m and "injected decode failure" in m for m in logged), logged
