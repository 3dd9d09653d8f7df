"""Every validation rule over HTTP, on the TGI and the OpenAI routes: a table of bad requests,
the status each gets and what its error must name (the field and the limit). Afterwards the same
server still answers valid requests on every route.
"""

import json

from tests.router.harness import async_test, router_env, scrape

LIMITS = dict(
    served_model_name="m",  # what the OpenAI bodies below name
    max_input_tokens=30,
    max_total_tokens=64,
    max_stop_sequences=2,
    max_best_of=2,
    max_top_n_tokens=3,
    payload_limit=4000,
    max_concurrent_requests=4,
)
GEN, COMP, CHAT = "/generate", "/v1/completions", "/v1/chat/completions"
LONG = "a " * 40  # 41 tokens > max_input_tokens (the chat template alone takes 24)
HI = [{"role": "user", "content": "Hi"}]


def g(**params):
    return {"inputs": "Hello", "parameters": params}


def c(**fields):
    return {"model": "m", "prompt": "Hello", **fields}


def ch(**fields):
    return {"model": "m", "messages": HI, **fields}


# (route, body, status, substrings the error must contain)
TABLE = [
    # sampling parameters, TGI's ranges
    (GEN, g(temperature=0), 422, ["`temperature`", "strictly positive"]),
    (GEN, g(top_k=0), 422, ["`top_k`", "strictly positive"]),
    (GEN, g(top_p=1.0), 422, ["`top_p`", "> 0.0 and < 1.0"]),
    (GEN, g(typical_p=0), 422, ["`typical_p`", "> 0.0 and < 1.0"]),
    (GEN, g(repetition_penalty=-1), 422, ["`repetition_penalty`", "strictly positive"]),
    (GEN, g(frequency_penalty=2.5), 422, ["`frequency_penalty`", ">= -2.0 and <= 2.0"]),
    (GEN, g(max_new_tokens=0), 422, ["`max_new_tokens`", "strictly positive"]),
    (GEN, g(stop=["a", "b", "c"]), 422, ["`stop`", "up to 2", "Given: 3"]),
    (GEN, g(stop=["x" * 1025]), 422, ["`stop`", "at most 1024 characters", "Given: 1025"]),
    (GEN, g(stop=[""]), 422, ["`stop`", "empty"]),
    (GEN, g(truncate=0), 422, ["`truncate`", "30", "Given: 0"]),
    (GEN, g(truncate=31), 422, ["`truncate`", "30", "Given: 31"]),
    (GEN, g(seed=-1), 422, ["`seed`", ">= 0"]),
    (GEN, g(seed=2**64), 422, ["`seed`", "64 bits"]),
    (GEN, g(top_n_tokens=4), 422, ["`top_n_tokens`", "<= 3", "Given: 4"]),
    (GEN, g(best_of=3, do_sample=True), 422, ["`best_of`", "<= 2", "Given: 3"]),
    (GEN, g(best_of=2), 422, ["`best_of`", "sampling"]),
    # lengths: a request the whole cache could not hold never gets queued
    (GEN, {"inputs": LONG, "parameters": {"max_new_tokens": 1}}, 422, ["`inputs`", "30", "41"]),
    (GEN, g(max_new_tokens=61), 422, ["`max_new_tokens`", "<= 64", "61"]),
    (GEN, {"inputs": ""}, 422, ["`inputs`", "empty"]),
    (GEN, {"parameters": {}}, 422, ["`inputs`"]),
    # bodies and types
    (GEN, b"{not json", 422, ["not valid JSON"]),
    (GEN, b'{"inputs": "x", "parameters": {"temperature": NaN}}', 422, ["not valid JSON"]),
    (GEN, b"[]", 422, ["JSON object"]),
    (GEN, {"inputs": 5}, 422, ["`inputs`", "string"]),
    (GEN, {"inputs": "x", "parameters": []}, 422, ["`parameters`", "object"]),
    (GEN, g(temperature="hot"), 422, ["`temperature`", "number"]),
    (GEN, g(max_new_tokens="5"), 422, ["`max_new_tokens`", "integer"]),
    (GEN, g(stop="END"), 422, ["`stop`", "list of strings"]),
    (GEN, g(details="yes"), 422, ["`details`", "boolean"]),
    (GEN, {"inputs": "x" * 5000}, 413, ["4000 bytes", "--payload-limit"]),
    ("/generate_stream", g(best_of=2, do_sample=True), 422, ["`best_of`", "streaming"]),
    ("/generate_stream", g(decoder_input_details=True), 422, ["`decoder_input_details`"]),
    # unknown fields: a typo would otherwise generate up to the default 1024 tokens
    (GEN, g(max_new_token=5), 422, ["unknown field `parameters.max_new_token`", "max_new_tokens`"]),
    (GEN, {"inputs": "Hello", "max_new_tokens": 5}, 422, ["unknown field `max_new_tokens`"]),
    ("/", {"inputs": "Hello", "parameters": {"temprature": 0.5}}, 422, ["`parameters.temprature`"]),
    ("/generate_stream", g(max_tokens=5), 422, ["unknown field `parameters.max_tokens`"]),
    (GEN, {"inputs": "Hello", "stream": True}, 422, ["`stream`", "/generate_stream"]),
    (GEN, g(adapter_id="my-lora"), 422, ["`adapter_id` 'my-lora'", "no LoRA adapters are loaded"]),
    ("/tokenize", {"inputs": "Hello", "add_special_token": False}, 422, ["`add_special_token`"]),
    # OpenAI completions: OpenAI's ranges and field names
    (COMP, c(temperature=2.5), 422, ["`temperature`", "<= 2.0", "2.5"]),
    (COMP, c(top_p=0), 422, ["`top_p`", "> 0.0 and <= 1.0"]),
    (COMP, c(frequency_penalty=-3), 422, ["`frequency_penalty`", ">= -2.0"]),
    (COMP, c(presence_penalty=2.5), 422, ["`presence_penalty`", ">= -2.0 and <= 2.0"]),
    (CHAT, ch(presence_penalty=-2.01), 422, ["`presence_penalty`", ">= -2.0 and <= 2.0"]),
    (COMP, c(n=129), 422, ["`n`", ">= 1 and <= 128", "Given: 129"]),
    (COMP, c(n=0), 422, ["`n`", ">= 1 and <= 128", "Given: 0"]),
    (COMP, c(best_of=3), 422, ["`best_of`", "<= 2", "Given: 3"]),  # --max-best-of
    (COMP, c(n=3, best_of=2), 422, ["`best_of` must be >= `n`", "Given: 2 and 3"]),
    (COMP, c(n=2, best_of=3, stream=True), 422, ["`best_of` != `n`", "streaming"]),
    (COMP, c(prompt=["a", "b"], n=5), 422, ["`prompt` × `best_of`/`n`", "10 sequences", "4"]),
    (CHAT, ch(n=5), 422, ["`n` asks for 5 sequences", "--max-concurrent-requests"]),
    (COMP, c(suffix="x"), 422, ["`suffix`", "not supported"]),
    (COMP, c(logit_bias={"x": 1}), 422, ["`logit_bias`", "token ids", "'x'"]),
    (COMP, c(logit_bias={"5": 101}), 422, ["`logit_bias`", ">= -100 and <= 100", "101"]),
    (COMP, c(logit_bias={"5": "up"}), 422, ["`logit_bias", "number"]),
    (COMP, c(logit_bias=[5]), 422, ["`logit_bias`", "JSON object"]),
    (CHAT, ch(logit_bias={"99999": 1}), 422, ["`logit_bias`", "[99999]", "vocabulary"]),
    (COMP, c(min_p=1.5), 422, ["`min_p`", ">= 0.0 and <= 1.0", "1.5"]),
    (COMP, c(logprobs=4), 422, ["`logprobs`", "<= 3", "Given: 4"]),
    (COMP, c(max_tokens=0), 422, ["`max_tokens`", "strictly positive"]),
    (COMP, c(max_tokens=61), 422, ["`max_tokens`", "<= 64"]),
    (COMP, c(max_tokens="x"), 422, ["`max_tokens`", "integer"]),
    (COMP, c(prompt=LONG, max_tokens=1), 422, ["`prompt`", "30"]),
    (COMP, c(prompt=""), 422, ["`prompt`", "empty"]),
    (COMP, c(prompt=[]), 422, ["`prompt`", "a list of token ids"]),
    (COMP, c(prompt=["a", ""]), 422, ["`prompt`", "empty prompt"]),
    (COMP, c(prompt=[[1], []]), 422, ["`prompt`", "empty prompt"]),
    (COMP, c(prompt=[1, -2]), 422, ["`prompt`", "integers >= 0"]),
    (COMP, c(prompt=[[1, 2.5]]), 422, ["`prompt`", "integers >= 0"]),
    (COMP, c(prompt=["a", 1]), 422, ["`prompt`", "element of type int"]),
    (COMP, c(prompt=[True]), 422, ["`prompt`", "element of type bool"]),
    (COMP, c(prompt=[1, 99999]), 422, ["`prompt`", "[99999]", "vocabulary"]),
    (COMP, c(prompt=[[1] * 31], max_tokens=1), 422, ["`prompt`", "30", "Given: 31"]),
    (COMP, c(stop=["a", "b", "c"]), 422, ["`stop`", "up to 2"]),
    (COMP, c(seed=-5), 422, ["`seed`", ">= 0"]),
    (COMP, c(stream_options={"include_usage": True}), 422, ["`stream_options`", "`stream`"]),
    (COMP, c(stream=True, stream_options={"usage": 1}), 422, ["unknown field `usage`"]),
    (COMP, c(frobnicate=1), 422, ["unknown field `frobnicate`"]),
    (COMP, c(stream="yes"), 422, ["`stream`", "boolean"]),
    # OpenAI chat
    (CHAT, ch(temperature=-1), 422, ["`temperature`", ">= 0.0"]),
    (CHAT, ch(n=129), 422, ["`n`", "<= 128"]),
    (CHAT, ch(logprobs=True, top_logprobs=4), 422, ["`top_logprobs`", "<= 3", "Given: 4"]),
    (CHAT, ch(top_logprobs=2), 422, ["`top_logprobs`", "`logprobs`"]),
    (CHAT, ch(max_completion_tokens=100), 422, ["`max_completion_tokens`", "<= 64"]),
    (CHAT, ch(max_tokens=100), 422, ["`max_tokens`", "<= 64"]),
    (CHAT, ch(tools=[{"type": "function", "function": {"name": "f"}}]), 422, ["`tools`"]),
    (CHAT, ch(response_format={"type": "xml"}), 422, ["`type`", "json_schema"]),
    (
        CHAT,
        ch(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}),
        422,
        ["`response_format.json_schema.schema` is not valid"],
    ),
    (CHAT, ch(response_format={"type": "json_schema"}), 422, ["`response_format`", "json_schema"]),
    (COMP, c(response_format={"type": "regex", "value": "(("}), 422, ["`response_format.value`"]),
    (
        CHAT,
        ch(structured_outputs={"regex": "a", "choice": ["x"]}),
        422,
        ["`structured_outputs` takes one constraint", "regex, choice"],
    ),
    (
        COMP,
        c(guided_regex="a", response_format={"type": "json_object"}),
        422,
        ["one output constraint per request, not `response_format`, `guided_regex`"],
    ),
    (COMP, c(guided_choice=[]), 422, ["`guided_choice`"]),
    (COMP, c(structured_outputs={"json": "{bad"}), 422, ["`structured_outputs.json` must be"]),
    (COMP, c(guided_json={"type": 5}), 422, ["`guided_json.json` is not valid"]),
    (CHAT, ch(messages=[]), 422, ["`messages`", "non-empty"]),
    (CHAT, {"model": "m"}, 422, ["`messages`"]),
    (CHAT, ch(messages=[{"content": "x"}]), 422, ["`messages[0].role`"]),
    (
        CHAT,
        ch(messages=[{"role": "wizard", "content": "x"}]),
        422,
        ["`messages[0].role`", "wizard"],
    ),
    (CHAT, ch(messages=[{"role": "user", "content": 5}]), 422, ["`messages[0].content`"]),
    (
        CHAT,
        ch(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        422,
        ["`messages[0].content`", "image_url"],
    ),
    (CHAT, ch(messages=[{"role": "user", "content": LONG}]), 422, ["`messages`", "30"]),
    (CHAT, ch(top_p="high"), 422, ["`top_p`", "number"]),
    (CHAT, ch(functions=[{"name": "f"}]), 422, ["`functions`"]),
    (CHAT, ch(foo=None), 422, ["unknown field `foo`"]),
]


async def _answer(client, route, body):
    if isinstance(body, bytes):
        r = await client.post(route, data=body, headers={"Content-Type": "application/json"})
    else:
        r = await client.post(route, json=body)
    return r.status, r.headers.get("Content-Type", ""), await r.text()


@async_test
async def test_every_rule_is_a_json_error_naming_field_and_limit(model_dir):
    async with router_env(model_dir, **LIMITS) as env:
        wrong = []
        for route, body, status, needles in TABLE:
            got, content_type, text = await _answer(env.client, route, body)
            shown = body if not isinstance(body, dict) else json.dumps(body)[:80]
            if got != status or not content_type.startswith("application/json"):
                wrong.append(f"{route} {shown}: {got} {text[:200]}")
                continue
            error = json.loads(text)
            if error.get("error_type") not in ("validation", "payload_too_large"):
                wrong.append(f"{route} {shown}: error_type {error}")
            missing = [n for n in needles if n not in error["error"]]
            if missing:
                wrong.append(f"{route} {shown}: {missing} not in {error['error']!r}")
        assert not wrong, "\n".join(wrong)

        # Nothing was queued, nothing is held; the server still serves every route.
        assert env.shards[0].prefilled == []
        metrics = await scrape(env.client)
        assert metrics['tgi_request_failure_total{err="validation"}'] >= len(TABLE) - 5
        # Known fields sent as null, as TGI's clients send every field they know.
        body = {"inputs": "Hello", "parameters": {"max_new_tokens": 3, "adapter_id": None}}
        r = await env.client.post(GEN, json={**body, "stream": False})
        # "Hello" is [43, 72, 79, 400]; the fake shards continue 401, 402, 403.
        expected = env.infer.tokenizer.decode([401, 402, 403])
        assert r.status == 200 and (await r.json())["generated_text"] == expected
        r = await env.client.post(COMP, json=c(max_tokens=2, user="u", stream=False))
        assert r.status == 200, await r.text()
        neutral = dict(logit_bias={}, presence_penalty=0, min_p=0)
        r = await env.client.post(CHAT, json=ch(max_tokens=2, **neutral))
        assert r.status == 200, await r.text()
        r = await env.client.post(GEN, json={"inputs": "x" * 3900, "parameters": {"truncate": 4}})
        assert r.status == 200, await r.text()  # at the payload limit, not over it
        assert env.violations() == []


@async_test
async def test_bodies_not_declared_as_json_are_415(model_dir):
    async with router_env(model_dir) as env:
        body = json.dumps(g(max_new_tokens=2)).encode()
        for route in (GEN, "/generate_stream", "/", "/tokenize", COMP, CHAT):
            for content_type in (None, "text/plain", "application/x-www-form-urlencoded"):
                # aiohttp would add application/octet-stream; an empty value means none at all.
                r = await env.client.post(
                    route, data=body, headers={"Content-Type": content_type or ""}
                )
                assert r.status == 415, (route, content_type, await r.text())
                error = await r.json()
                assert error["error_type"] == "unsupported_media_type"
                assert "application/json" in error["error"]
                assert (content_type or "no Content-Type") in error["error"]
        for content_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
            r = await env.client.post(GEN, data=body, headers={"Content-Type": content_type})
            assert r.status == 200, (content_type, await r.text())
        assert env.shards[0].prefilled and env.violations() == []


@async_test
async def test_a_prompt_tokenizing_past_the_models_vocabulary_is_422(model_dir, tokenizer):
    # The tokenizer knows 512 tokens, the model only 300: a prompt whose tokens include ids
    # past 300 would fail the shards' step (and everyone's in it).
    text = "zebra quantum Ünïcödé 🚀"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert max(ids) >= 300 and min(ids) < 300, ids
    async with router_env(model_dir, shard={"vocab_size": 300}) as env:
        r = await env.client.post("/generate", json={"inputs": text})
        assert r.status == 422
        body = await r.json()
        assert "model's vocabulary of 300" in body["error"] and "`inputs`" in body["error"]
        assert not [c for s in env.shards for c in s.calls if c == "Prefill"]
        ok = await env.client.post(
            "/generate", json={"inputs": "a", "parameters": {"max_new_tokens": 2}}
        )
        assert ok.status == 200, await ok.text()
