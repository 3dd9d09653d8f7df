"""The real router (startup, warmup, scheduler, HTTP) against two deterministic fake shards.

The fake shards answer next token = last token + 1. In the tiny tokenizer "H" is followed by
"I", "J", "K", ... so a prompt "H" generates "IJK...".
"""

import asyncio

from tests.router.harness import async_test, parse_sse, router_env, scrape, wait_until


def gen(inputs="H", **params):
    return {"inputs": inputs, "parameters": params}


def logged(caplog, *needles: str) -> bool:
    """Whether one record of the router's log holds every needle (a request id and a detail)."""
    return any(all(n in r.getMessage() for n in needles) for r in caplog.records)


@async_test
async def test_generate_with_details(model_dir):
    async with router_env(model_dir) as env:
        r = await env.client.post(
            "/generate",
            json=gen(max_new_tokens=5, details=True, decoder_input_details=True, top_n_tokens=2),
        )
        assert r.status == 200, await r.text()
        body = await r.json()
        assert body["generated_text"] == "IJKLM"
        d = body["details"]
        assert d["finish_reason"] == "length" and d["generated_tokens"] == 5
        assert d["seed"] is None  # greedy: TGI reports no seed
        assert d["prefill"] == [{"id": 43, "text": "H", "logprob": None}]
        assert [t["text"] for t in d["tokens"]] == list("IJKLM")
        assert all(set(t) == {"id", "text", "logprob", "special"} for t in d["tokens"])
        assert len(d["top_tokens"]) == 5 and len(d["top_tokens"][0]) == 2
        assert r.headers["x-generated-tokens"] == "5" and r.headers["x-prompt-tokens"] == "1"
        # Without details TGI omits the key entirely.
        r = await env.client.post("/generate", json=gen(max_new_tokens=2))
        assert await r.json() == {"generated_text": "IJ"}
        # Both shards got every call, in the same order (ServiceDiscovery asks rank 0 only).
        assert env.shards[0].calls[0] == "ServiceDiscovery"
        assert env.shards[0].calls[1:] == env.shards[1].calls
        assert env.violations() == []
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)


@async_test
async def test_return_full_text_eos_and_stop_sequence(model_dir):
    async with router_env(model_dir) as env:
        r = await env.client.post("/generate", json=gen(max_new_tokens=3, return_full_text=True))
        assert (await r.json())["generated_text"] == "HIJK"
        # "<s>" is token 1; the next token is 2, the EOS token (special: skipped in the text).
        r = await env.client.post("/generate", json=gen("<s>", max_new_tokens=9, details=True))
        body = await r.json()
        assert body["generated_text"] == ""
        assert body["details"]["finish_reason"] == "eos_token"
        assert body["details"]["tokens"][0] == {
            "id": 2,
            "text": "</s>",
            "logprob": body["details"]["tokens"][0]["logprob"],
            "special": True,
        }
        r = await env.client.post(
            "/generate", json=gen(max_new_tokens=9, stop=["KL"], details=True)
        )
        body = await r.json()
        assert body["generated_text"] == "IJKL"  # TGI keeps the stop sequence
        assert body["details"]["finish_reason"] == "stop_sequence"
        assert body["details"]["generated_tokens"] == 4
        assert env.violations() == []


@async_test
async def test_sampling_seed_reaches_the_shards_and_is_reported(model_dir):
    async with router_env(model_dir) as env:
        r = await env.client.post(
            "/generate", json=gen(max_new_tokens=2, do_sample=True, seed=42, details=True)
        )
        assert (await r.json())["details"]["seed"] == 42
        r = await env.client.post("/generate", json=gen(max_new_tokens=2, top_k=3, details=True))
        seed = (await r.json())["details"]["seed"]
        assert isinstance(seed, int) and 0 <= seed < 2**64
        r = await env.client.post(
            "/generate", json=gen(max_new_tokens=3, best_of=2, do_sample=True, details=True)
        )
        body = await r.json()
        assert r.status == 200, body
        others = body["details"]["best_of_sequences"]
        assert len(others) == 1 and others[0]["generated_text"] == "IJK"
        assert others[0]["seed"] != body["details"]["seed"]
        assert env.violations() == []


@async_test
async def test_generate_stream_sse(model_dir):
    async with router_env(model_dir) as env:
        r = await env.client.post(
            "/generate_stream", json=gen("Emoji: ", max_new_tokens=12, details=True, top_n_tokens=1)
        )
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = parse_sse(await r.text())
        assert [e["index"] for e in events] == list(range(1, 13))
        assert all(e["generated_text"] is None and e["details"] is None for e in events[:-1])
        last = events[-1]
        assert last["details"] == {
            "finish_reason": "length",
            "generated_tokens": 12,
            "seed": None,
            "input_length": 3,
        }
        # The streamed texts add up to the final text (no special tokens here).
        assert "".join(e["token"]["text"] for e in events) == last["generated_text"]
        assert all(len(e["top_tokens"]) == 1 for e in events)
        assert env.violations() == []


@async_test
async def test_compat_route(model_dir):
    async with router_env(model_dir) as env:
        r = await env.client.post(
            "/", json={**gen(max_new_tokens=2, details=True), "stream": False}
        )
        body = await r.json()
        assert isinstance(body, list) and body[0]["generated_text"] == "IJ"  # api-inference shape
        r = await env.client.post("/", json={**gen(max_new_tokens=2), "stream": True})
        events = parse_sse(await r.text())
        assert [e["token"]["text"] for e in events] == ["I", "J"]
        assert events[-1]["generated_text"] == "IJ"
        # Details come with the last event even when not asked for.
        assert events[-1]["details"]["finish_reason"] == "length"


@async_test
async def test_concurrent_requests_are_batched(model_dir):
    async with router_env(model_dir) as env:
        prompts = ["H", "A", "a", "0", "Hello", "The quick", "日本", "Emoji: 🚀"]

        async def one(i, prompt):
            r = await env.client.post("/generate", json=gen(prompt, max_new_tokens=4 + 3 * i))
            assert r.status == 200, await r.text()
            return (await r.json())["generated_text"]

        texts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        # Same answer as alone: batching must not mix requests up.
        for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
            r = await env.client.post("/generate", json=gen(prompt, max_new_tokens=4 + 3 * i))
            assert (await r.json())["generated_text"] == text
        assert max(s.max_batch_size_seen for s in env.shards) > 1
        assert env.shards[0].calls.count("FilterBatch") > 0
        assert env.violations() == []
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)
        await wait_until(lambda: not env.shards[0].batches and not env.shards[0].owner)


@async_test
async def test_requests_wait_for_kv_blocks(model_dir):
    # 40 blocks of 4 tokens, one reserved: 156 tokens, room for two 64-token requests at once.
    async with router_env(model_dir, shard={"num_blocks": 40}, max_total_tokens=64) as env:
        assert env.infer.limits.batch_total_tokens == 156

        async def one():
            r = await env.client.post("/generate", json=gen("Hello", max_new_tokens=60))
            assert r.status == 200, await r.text()
            return (await r.json())["generated_text"]

        texts = await asyncio.gather(*(one() for _ in range(6)))
        assert len(set(texts)) == 1
        assert max(s.max_batch_size_seen for s in env.shards) == 2
        assert env.violations() == []
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)


@async_test
async def test_max_batch_total_tokens_flag_bounds_the_batch(model_dir):
    async with router_env(model_dir, max_total_tokens=64, max_batch_total_tokens=64) as env:
        assert env.infer.limits.batch_total_tokens == 64

        async def one():
            r = await env.client.post("/generate", json=gen("Hello", max_new_tokens=60))
            assert r.status == 200, await r.text()

        await asyncio.gather(one(), one(), one())
        assert max(s.max_batch_size_seen for s in env.shards) == 1
        assert env.violations() == []


@async_test
async def test_prefill_error_is_424_and_the_router_keeps_serving(model_dir, caplog):
    # Only rank 0 fails: the router must still clear the batch rank 1 cached.
    async with router_env(model_dir) as env:
        env.shards[0].fail_prefill_token = 72  # "e"
        r = await env.client.post("/generate", json=gen("Hello", max_new_tokens=3))
        assert r.status == 424
        body = await r.json()
        rid = r.headers["x-request-id"]
        assert body == {
            "error": "Request failed during generation: Prefill failed on shard 0 "
            "(the server log has the details under this request_id)",
            "error_type": "generation",
            "request_id": rid,
        }
        # The shard's own words go to the log, under the id the client was given.
        assert logged(caplog, rid, "Prefill failed on shard 0: injected prefill failure")
        # A streaming request that fails before its first token gets plain JSON too.
        r = await env.client.post("/generate_stream", json=gen("Hello", max_new_tokens=3))
        assert r.status == 424 and (await r.json())["error_type"] == "generation"
        r = await env.client.post("/generate", json=gen(max_new_tokens=3))
        assert r.status == 200 and (await r.json())["generated_text"] == "IJK"
        assert env.violations() == []
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)
        await wait_until(lambda: not env.shards[1].batches and not env.shards[1].owner)


@async_test
async def test_decode_error_fails_the_stream_and_the_router_recovers(model_dir, caplog):
    async with router_env(model_dir) as env:
        env.shards[1].fail_next_decode = True
        r = await env.client.post("/generate_stream", json=gen(max_new_tokens=5))
        assert r.status == 200
        events = parse_sse(await r.text())
        assert events[0]["token"]["text"] == "I"  # from Prefill, before the failure
        rid = r.headers["x-request-id"]
        assert events[-1] == {
            "error": "Request failed during generation: Decode failed on shard 1 "
            "(the server log has the details under this request_id)",
            "error_type": "generation",
            "request_id": rid,
        }
        assert logged(caplog, rid, "Decode failed on shard 1: injected decode failure")
        r = await env.client.post("/generate", json=gen(max_new_tokens=5))
        assert (await r.json())["generated_text"] == "IJKLM"
        assert env.violations() == []
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)


@async_test
async def test_scheduler_survives_router_bugs(model_dir, caplog):
    async with router_env(model_dir) as env:
        batcher = env.infer.batcher
        real_apply, real_next_batch = batcher.results.apply, env.infer.queue.next_batch
        calls = {"apply": 0, "next_batch": 0}

        def bad_apply(entry, gen):
            calls["apply"] += 1
            if calls["apply"] == 1:
                raise RuntimeError("bug in result handling")
            return real_apply(entry, gen)

        def bad_next_batch(*args, **kwargs):
            calls["next_batch"] += 1
            if calls["next_batch"] == 1:
                raise RuntimeError("bug in admission")
            return real_next_batch(*args, **kwargs)

        batcher.results.apply = bad_apply
        r = await env.client.post("/generate", json=gen(max_new_tokens=3))
        body = await r.json()
        assert r.status == 424 and body["error_type"] == "generation"
        assert "bug in result handling" not in body["error"]  # a traceback's words stay inside
        bug = [rec for rec in caplog.records if body["request_id"] in rec.getMessage()]
        assert bug and "bug in result handling" in str(bug[0].exc_info[1])
        env.infer.queue.next_batch = bad_next_batch
        r = await env.client.post("/generate", json=gen(max_new_tokens=3))
        assert r.status == 200 and (await r.json())["generated_text"] == "IJK"
        assert calls["next_batch"] >= 2
        assert env.violations() == []
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)


@async_test
async def test_client_disconnect_frees_blocks(model_dir):
    async with router_env(model_dir, shard={"decode_delay": 0.01}) as env:
        r = await env.client.post("/generate_stream", json=gen(max_new_tokens=200))
        first = await r.content.readline()
        assert first.startswith(b"data:")
        assert env.infer.allocator.used_blocks > 0
        r.close()  # the client goes away mid-stream
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)
        await wait_until(lambda: not env.shards[0].batches)
        assert env.shards[0].calls.count("Decode") < 100

        # Same for a non-streaming request whose client gives up.
        task = asyncio.create_task(env.client.post("/generate", json=gen(max_new_tokens=200)))
        await wait_until(lambda: env.infer.allocator.used_blocks > 0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)
        await wait_until(lambda: not env.shards[1].batches)
        assert env.violations() == []
        r = await env.client.post("/generate", json=gen(max_new_tokens=2))
        assert (await r.json())["generated_text"] == "IJ"


@async_test
async def test_overload_is_429(model_dir):
    async with router_env(
        model_dir, shard={"decode_delay": 0.01}, max_concurrent_requests=1
    ) as env:
        r1 = await env.client.post("/generate_stream", json=gen(max_new_tokens=30))
        await r1.content.readline()
        r2 = await env.client.post("/generate", json=gen(max_new_tokens=2))
        assert r2.status == 429
        assert await r2.json() == {
            "error": "Model is overloaded",
            "error_type": "overloaded",
            "request_id": r2.headers["x-request-id"],
        }
        await r1.text()
        r3 = await env.client.post("/generate", json=gen(max_new_tokens=2))
        assert r3.status == 200


@async_test
async def test_validation_errors_over_http(model_dir):
    async with router_env(model_dir) as env:
        for path in ("/generate", "/generate_stream", "/"):
            r = await env.client.post(path, json=gen(top_p=1.5))
            assert r.status == 422
            assert r.headers["Content-Type"].startswith("application/json")
            assert await r.json() == {
                "error": "Input validation error: `top_p` must be > 0.0 and < 1.0",
                "error_type": "validation",
                "request_id": r.headers["x-request-id"],
            }
        json_type = {"Content-Type": "application/json"}
        r = await env.client.post("/generate", data=b"{oops", headers=json_type)
        assert r.status == 422 and (await r.json())["error_type"] == "validation"
        r = await env.client.post("/generate", json=gen(max_new_tokens=1000))
        assert "`inputs` tokens + `max_new_tokens` must be <= 256" in (await r.json())["error"]
        r = await env.client.get("/nope")
        assert r.status == 404 and (await r.json())["error_type"] == "http"
        # A known route with the wrong method: JSON too, and the Allow header RFC 9110 requires.
        r = await env.client.get("/generate")
        assert r.status == 405 and (await r.json())["error_type"] == "http"
        assert r.headers["Allow"] == "POST"


@async_test
async def test_head_answers_like_get(model_dir):
    """Load balancers and uptime checks probe with HEAD: the GET routes answer it, without a
    body, where a 405 would mark the server down."""
    async with router_env(model_dir) as env:
        for path in ("/health", "/info", "/v1/models", "/metrics", "/openapi.json"):
            got = await env.client.get(path)
            head = await env.client.head(path)
            assert (head.status, got.status) == (200, 200), path
            assert await head.read() == b"", path
        env.shards[1].healthy = False
        assert (await env.client.head("/health")).status == 503
        # POST routes still refuse it, naming what they take.
        r = await env.client.head("/generate")
        assert r.status == 405 and r.headers["Allow"] == "POST"


@async_test
async def test_json_the_tokenizer_cannot_take_is_a_422(model_dir):
    """A body nested past the parser's recursion, or holding an unpaired UTF-16 surrogate (valid
    JSON syntax, not Unicode text), is the client's error on every route: never a 500, never a
    misleading "empty" message, and the server goes on serving."""
    json_type = {"Content-Type": "application/json"}
    nested = b"[" * 5000 + b"]" * 5000
    cases = [
        ("/generate", b'{"inputs": "hi", "parameters": ' + nested + b"}", "nested too deeply"),
        ("/v1/completions", b'{"prompt": ' + nested + b"}", "nested too deeply"),
        ("/v1/chat/completions", b'{"messages": ' + nested + b"}", "nested too deeply"),
        ("/tokenize", b'{"inputs": "hi \\ud800"}', "surrogate \\ud800"),
        ("/generate", b'{"inputs": "hi \\ud800 there"}', "surrogate \\ud800"),
        ("/generate_stream", b'{"inputs": "hi \\uDFFF"}', "surrogate \\udfff"),
        ("/v1/completions", b'{"prompt": "hi \\udfff", "max_tokens": 2}', "surrogate \\udfff"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "hi \\ud83d"}], "max_tokens": 2}',
            "surrogate \\ud83d",
        ),
    ]
    async with router_env(model_dir) as env:
        for path, body, says in cases:
            r = await env.client.post(path, data=body, headers=json_type)
            assert r.status == 422, (path, body[:40], await r.text())
            error = await r.json()
            assert error["error_type"] == "validation" and says in error["error"], error
        # A surrogate pair is one real character, and a literal backslash-u is plain text.
        for inputs in (b'"\\ud83d\\ude80 go"', b'"\\\\ud800"'):
            body = b'{"inputs": ' + inputs + b', "parameters": {"max_new_tokens": 2}}'
            r = await env.client.post("/generate", data=body, headers=json_type)
            assert r.status == 200, await r.text()
        assert (await env.client.get("/health")).status == 200


@async_test
async def test_health_info_tokenize(model_dir):
    async with router_env(model_dir, served_model_name="tiny") as env:
        r = await env.client.get("/health")
        assert r.status == 200
        env.shards[1].healthy = False
        r = await env.client.get("/health")
        assert r.status == 503
        assert await r.json() == {
            "error": "unhealthy",
            "error_type": "healthcheck",
            "request_id": r.headers["x-request-id"],
        }

        info = await (await env.client.get("/info")).json()
        assert info["model_id"] == "tiny" and info["router"] == "switchyard"
        assert info["model_dtype"] == "float32" and info["model_device_type"] == "cpu"
        assert info["max_input_tokens"] == 255 and info["max_total_tokens"] == 256
        assert info["max_batch_total_tokens"] == 159 * 4
        assert info["max_concurrent_requests"] == 128 and info["max_best_of"] == 2
        assert info["max_stop_sequences"] == 4 and info["waiting_served_ratio"] == 0.3
        assert info["max_waiting_tokens"] == 20 and isinstance(info["version"], str)

        await env.client.post("/generate", json=gen(max_new_tokens=3))
        await env.client.post("/generate", json=gen(top_k=-1))
        m = await scrape(env.client)
        assert m["tgi_request_count_total"] == 2 and m["tgi_request_success_total"] == 1
        assert m['tgi_request_failure_total{err="validation"}'] == 1
        assert m["switchyard_generated_tokens_total"] == 3
        assert m['tgi_batch_forward_duration_count{method="decode"}'] == 2
        assert m["switchyard_kv_blocks_total"] == 159 and m["tgi_queue_size"] == 0

        r = await env.client.post("/tokenize", json={"inputs": "Hello 日本"})
        toks = await r.json()
        assert [t["id"] for t in toks] == env.infer.tokenizer.decoder.encode("Hello 日本")
        assert toks[0] == {"id": 43, "text": "H", "start": 0, "stop": 1}
