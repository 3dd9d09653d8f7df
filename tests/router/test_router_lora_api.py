"""LoRA adapters on the HTTP surface against fake shards: which names each route accepts, what
reaches the shards as `adapter_id`, the errors for unknown names, the listings and the metrics."""

from router.adapters import LoraAdapter
from tests.router.harness import async_test, parse_sse, router_env, scrape

ADAPTERS = (LoraAdapter("sql", "/adapters/sql"), LoraAdapter("chat-v2", "/adapters/chat"))
HI = [{"role": "user", "content": "Hi"}]


def lora_env(model_dir, **args):
    return router_env(
        model_dir, served_model_name="tiny", lora_adapters=ADAPTERS, max_loras=2, **args
    )


def gen(**params):
    return {"inputs": "Hello", "parameters": {"max_new_tokens": 3, **params}}


async def _error(response, status: int, error_type: str) -> str:
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    body = await response.json()
    assert body["error_type"] == error_type and body["request_id"]
    return body["error"]


@async_test
async def test_tgi_routes_take_a_loaded_adapter_and_name_an_unknown_one(model_dir):
    async with lora_env(model_dir) as env:
        shard = env.shards[0]
        r = await env.client.post("/generate", json=gen(adapter_id="sql"))
        assert r.status == 200, await r.text()
        assert shard.prefilled[-1].adapter_id == "sql"
        r = await env.client.post("/generate_stream", json=gen(adapter_id="chat-v2"))
        assert r.status == 200
        assert parse_sse(await r.text())[-1]["details"]["finish_reason"] == "length"
        assert shard.prefilled[-1].adapter_id == "chat-v2"
        for body in (gen(), gen(adapter_id=None), gen(adapter_id="")):
            r = await env.client.post("/generate", json=body)
            assert r.status == 200
            assert shard.prefilled[-1].adapter_id == ""
        sent = len(shard.prefilled)

        for route in ("/generate", "/generate_stream", "/"):
            r = await env.client.post(route, json=gen(adapter_id="sqll"))
            message = await _error(r, 422, "validation")
            assert "`adapter_id` 'sqll' is not a loaded LoRA adapter" in message
            assert "Loaded: sql, chat-v2" in message
        # The served model's name is not an adapter: TGI's base model is "no adapter_id".
        r = await env.client.post("/generate", json=gen(adapter_id="tiny"))
        assert "`adapter_id` 'tiny'" in await _error(r, 422, "validation")
        assert len(shard.prefilled) == sent  # nothing unknown reached the shards
        assert env.violations() == []


@async_test
async def test_openai_model_selects_an_adapter_or_is_a_404(model_dir):
    async with lora_env(model_dir) as env:
        shard = env.shards[0]
        routes = [
            ("/v1/completions", {"prompt": "Hello", "max_tokens": 3}),
            ("/v1/chat/completions", {"messages": HI, "max_tokens": 3}),
        ]
        for route, body in routes:
            for model, sent in [("sql", "sql"), ("chat-v2", "chat-v2"), ("tiny", ""), (None, "")]:
                payload = {**body, "model": model} if model is not None else body
                r = await env.client.post(route, json=payload)
                assert r.status == 200, await r.text()
                assert shard.prefilled[-1].adapter_id == sent
                assert (await r.json())["model"] == (model or "tiny")
            r = await env.client.post(route, json={**body, "model": "chat-v2", "stream": True})
            assert r.status == 200
            chunks = parse_sse((await r.text()).replace("data: [DONE]", ""))
            assert chunks and {c["model"] for c in chunks} == {"chat-v2"}
            assert shard.prefilled[-1].adapter_id == "chat-v2"

            sent = len(shard.prefilled)
            for stream in (False, True):
                r = await env.client.post(route, json={**body, "model": "gpt-4o", "stream": stream})
                message = await _error(r, 404, "model_not_found")
                assert message == (
                    "The model `gpt-4o` does not exist. Available models: tiny, sql, chat-v2"
                )
            assert len(shard.prefilled) == sent
        assert env.violations() == []


@async_test
async def test_without_adapters_every_route_keeps_its_old_answers(model_dir):
    async with router_env(model_dir, served_model_name="tiny") as env:
        r = await env.client.post("/generate", json=gen(adapter_id="sql"))
        message = await _error(r, 422, "validation")
        assert "`adapter_id` 'sql': no LoRA adapters are loaded on this server" in message
        # `model` must name the served model, adapters or not (OpenAI's and vLLM's 404).
        r = await env.client.post("/v1/completions", json={"model": "tgi", "prompt": "H"})
        message = await _error(r, 404, "model_not_found")
        assert message == "The model `tgi` does not exist. Available models: tiny"
        r = await env.client.post("/v1/completions", json={"model": "tiny", "prompt": "H"})
        assert r.status == 200 and env.shards[0].prefilled[-1].adapter_id == ""
        info = await (await env.client.get("/info")).json()
        assert info["lora_adapters"] == [] and info["max_loras"] == 4
        models = (await (await env.client.get("/v1/models")).json())["data"]
        assert [(m["id"], m["parent"]) for m in models] == [("tiny", None)]


@async_test
async def test_models_and_info_list_every_adapter(model_dir):
    async with lora_env(model_dir) as env:
        r = await env.client.get("/v1/models")
        assert r.status == 200
        models = (await r.json())["data"]
        assert [(m["id"], m["object"], m["parent"], m["root"]) for m in models] == [
            ("tiny", "model", None, "tiny"),
            ("sql", "model", "tiny", "/adapters/sql"),
            ("chat-v2", "model", "tiny", "/adapters/chat"),
        ]
        assert all(m["owned_by"] == "switchyard" and m["created"] > 0 for m in models)
        info = await (await env.client.get("/info")).json()
        assert info["lora_adapters"] == ["sql", "chat-v2"]
        assert info["max_loras"] == 2


@async_test
async def test_metrics_count_requests_and_tokens_per_adapter(model_dir):
    async with lora_env(model_dir) as env:
        before = await scrape(env.client)
        for label in ("base", "sql", "chat-v2"):
            assert before[f'switchyard_adapter_requests_total{{adapter="{label}"}}'] == 0
            assert before[f'switchyard_adapter_generated_tokens_total{{adapter="{label}"}}'] == 0
        assert before["switchyard_lora_adapters_live"] == 0
        assert before["switchyard_lora_max_loras"] == 2

        for params in ({"adapter_id": "sql"}, {"adapter_id": "sql", "max_new_tokens": 5}, {}):
            r = await env.client.post("/generate", json=gen(**params))
            assert r.status == 200
        r = await env.client.post("/generate", json=gen(adapter_id="nope"))
        assert r.status == 422

        after = await scrape(env.client)
        assert after['switchyard_adapter_requests_total{adapter="sql"}'] == 2
        assert after['switchyard_adapter_requests_total{adapter="base"}'] == 1
        assert after['switchyard_adapter_requests_total{adapter="chat-v2"}'] == 0
        assert after['switchyard_adapter_generated_tokens_total{adapter="sql"}'] == 3 + 5
        assert after['switchyard_adapter_generated_tokens_total{adapter="base"}'] == 3
        # The label only ever takes the configured names (and "base"): never a refused one.
        labelled = [k for k in after if k.startswith("switchyard_adapter_")]
        assert not [k for k in labelled if "nope" in k]
        assert len(labelled) == 6
        assert after["switchyard_lora_adapters_live"] == 0  # everything finished
