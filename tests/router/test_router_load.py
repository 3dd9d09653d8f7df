"""Cancellation, overload and the metrics that show them, against fake shards."""

import asyncio
import time

from tests.router.harness import async_test, parse_sse, router_env, scrape, wait_until

OVERLOADED = {"error": "Model is overloaded", "error_type": "overloaded"}


def overloaded(r) -> dict:
    """The 429 body, whose request_id is the one in the response's header."""
    return {**OVERLOADED, "request_id": r.headers["x-request-id"]}


def gen(inputs="H", **params):
    return {"inputs": inputs, "parameters": params}


@async_test
async def test_cancelled_requests_give_every_kv_block_back(model_dir):
    # Slow decodes: 60 tokens take over a second, the clients leave long before.
    async with router_env(model_dir, shard={"decode_delay": 0.02}) as env:
        total = (await scrape(env.client))["switchyard_kv_blocks_total"]
        streams = []
        for path in ("/generate_stream", "/v1/completions", "/v1/chat/completions"):
            for prompt in ("H", "Hello"):
                body = gen(prompt, max_new_tokens=60)
                if path == "/v1/completions":
                    body = {"prompt": prompt, "max_tokens": 60, "stream": True}
                if path == "/v1/chat/completions":
                    messages = [{"role": "user", "content": prompt}]
                    body = {"messages": messages, "max_tokens": 60, "stream": True}
                r = await env.client.post(path, json=body)
                assert r.status == 200
                await r.content.readline()
                streams.append(r)
        waiting = asyncio.create_task(env.client.post("/generate", json=gen(max_new_tokens=60)))
        await wait_until(lambda: len(env.infer.batcher.entries) == 7)
        m = await scrape(env.client)
        assert m["switchyard_kv_blocks_used"] > 0 and m["tgi_batch_current_size"] == 7
        assert m["switchyard_kv_blocks_used"] + m["switchyard_kv_blocks_free"] == total

        for r in streams:  # the clients go away mid-generation
            r.close()
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)
        m = await scrape(env.client)
        assert m["switchyard_kv_blocks_used"] == 0 and m["switchyard_kv_blocks_free"] == total
        assert m["tgi_batch_current_size"] == 0 and m["switchyard_request_cancelled_total"] == 7
        assert m["tgi_request_success_total"] == 0
        await wait_until(lambda: not env.shards[0].batches and not env.shards[1].owner)
        assert env.shards[0].calls.count("Decode") < 59  # nobody generated to the end
        r = await env.client.post("/generate", json=gen(max_new_tokens=2))
        assert (await r.json())["generated_text"] == "IJ"
        assert env.violations() == []


@async_test
async def test_overload_is_429_at_once_and_no_accepted_request_is_lost(model_dir):
    async with router_env(
        model_dir, shard={"decode_delay": 0.005}, max_concurrent_requests=4
    ) as env:
        held = [
            await env.client.post("/generate_stream", json=gen(p, max_new_tokens=40))
            for p in ("H", "A", "a", "0")
        ]
        for r in held:
            await r.content.readline()
        started = time.monotonic()
        refused = await asyncio.gather(
            env.client.post("/generate", json=gen(max_new_tokens=2)),
            env.client.post("/generate_stream", json=gen(max_new_tokens=2)),
            env.client.post("/v1/completions", json={"prompt": "H", "max_tokens": 2}),
            env.client.post("/v1/chat/completions", json={"messages": [{"role": "user"}]}),
        )
        assert time.monotonic() - started < 1.0  # at once, not after the running ones
        for r in refused:
            assert r.status == 429 and await r.json() == overloaded(r)
        for r in held:
            events = parse_sse(await r.text())
            assert len(events) == 39 and events[-1]["details"]["finish_reason"] == "length"

        # A burst: every request is either refused at once or answered in full.
        async def one(i):
            r = await env.client.post("/generate", json=gen(max_new_tokens=5 + i))
            return r.status, await r.json(), overloaded(r)

        answers = await asyncio.gather(*(one(i) for i in range(16)))
        ok = [(i, body) for i, (status, body, _) in enumerate(answers) if status == 200]
        refused_count = sum(1 for status, body, want in answers if status == 429 and body == want)
        assert len(ok) + refused_count == 16 and len(ok) >= 4
        expected = "IJKLMNOPQRSTUVWXYZ"
        assert all(body["generated_text"] == expected[: 5 + i] for i, body in ok)
        m = await scrape(env.client)
        assert m['tgi_request_failure_total{err="overloaded"}'] == 4 + refused_count
        assert m["tgi_request_success_total"] == 4 + len(ok)
        assert m["switchyard_requests_in_flight"] == 0
        assert env.violations() == []


@async_test
async def test_latency_histograms_and_step_timings(model_dir):
    async with router_env(model_dir) as env:
        for n in (3, 5):
            await env.client.post("/generate", json=gen(max_new_tokens=n))
        await env.client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4})
        m = await scrape(env.client)
        for name in (
            "tgi_request_duration",
            "tgi_request_validation_duration",
            "tgi_request_queue_duration",
            "tgi_request_inference_duration",
            "switchyard_time_to_first_token_seconds",
            "tgi_request_input_length",
            "tgi_request_generated_tokens",
        ):
            assert m[f"{name}_count"] == 3, name
            assert m[f'{name}_bucket{{le="+Inf"}}'] == 3, name
        # 12 tokens for 3 requests: 9 gaps between consecutive tokens.
        assert m["switchyard_inter_token_latency_seconds_count"] == 9
        assert m["tgi_request_generated_tokens_sum"] == 12
        assert m["switchyard_generated_tokens_total"] == 12
        assert m["switchyard_prompt_tokens_total"] == 1 + 1 + 4
        assert m['tgi_batch_inference_count_total{method="prefill"}'] == 3
        for part in ("forward", "decode", "inference"):
            assert m[f'tgi_batch_{part}_duration_count{{method="prefill"}}'] == 3
            assert m[f'tgi_batch_{part}_duration_count{{method="decode"}}'] == 9
        assert m["tgi_batch_next_size_count"] == 3
