"""A known adapter whose files the shards cannot read again (changed or gone after a host cache
eviction) fails its own requests only: the shards report them in PrefillResponse.adapter_failures
and step the rest, and the router answers them 424 naming the adapter while every other request
of that Prefill, new or running, base model or other adapter, completes as if nothing happened."""

import asyncio

from router.adapters import LoraAdapter
from tests.router.harness import async_test, parse_sse, router_env, wait_until

ADAPTERS = (LoraAdapter("a", "/adapters/a"), LoraAdapter("b", "/adapters/b"))


def lora_env(model_dir, **args):
    shard = {"decode_delay": 0.005, "max_loras": 2, "unreadable_adapters": frozenset({"a"})}
    return router_env(
        model_dir,
        shard=shard,
        lora_adapters=ADAPTERS,
        max_loras=2,
        served_model_name="tiny",
        **args,
    )


def gen(inputs: str, adapter: str, n: int) -> dict:
    return {"inputs": inputs, "parameters": {"max_new_tokens": n, "adapter_id": adapter}}


async def _tokens(env, body) -> list[int]:
    r = await env.client.post("/generate", json={**body, "parameters": {
        **body["parameters"], "details": True}})  # fmt: skip
    assert r.status == 200, await r.text()
    return [t["id"] for t in (await r.json())["details"]["tokens"]]


async def _refused(response) -> None:
    assert response.status == 424, await response.text()
    body = await response.json()
    assert body["error_type"] == "generation"
    assert "LoRA adapter 'a' could not be read" in body["error"]


async def _check_clean(env) -> None:
    batcher = env.infer.batcher
    await wait_until(lambda: not batcher.entries and env.infer.allocator.used_blocks == 0)
    assert batcher.adapters.distinct == 0 and batcher.adapters.draining is None
    assert env.violations() == []


@async_test
async def test_only_the_unreadable_adapters_requests_fail_and_the_step_goes_on(model_dir):
    async with lora_env(model_dir) as env:
        alone = {
            body: await _tokens(env, gen(body, ad, 12)) for body, ad in [("X", ""), ("B", "b")]
        }
        # Running requests (base and b) are stepped in the same Prefill that starts a's.
        streams = [
            await env.client.post("/generate_stream", json=gen(x, ad, 12))
            for x, ad in [("X", ""), ("B", "b")]
        ]
        firsts = [await s.content.readline() for s in streams]
        assert all(f.startswith(b"data:") for f in firsts)
        # New requests beside a's, in one Prefill when they are admitted together.
        new = [
            asyncio.create_task(_tokens(env, gen(x, ad, 12))) for x, ad in [("X", ""), ("B", "b")]
        ]
        await _refused(await env.client.post("/generate", json=gen("A", "a", 12)))
        await _refused(
            await env.client.post(
                "/v1/completions", json={"model": "a", "prompt": "A", "max_tokens": 4}
            )
        )
        for text, first, s in zip(["X", "B"], firsts, streams, strict=True):
            events = parse_sse((first + await s.read()).decode())
            assert [e["token"]["id"] for e in events] == alone[text]
            assert events[-1]["details"]["finish_reason"] == "length"
        assert [await t for t in new] == [alone["X"], alone["B"]]
        await _check_clean(env)


@async_test
async def test_a_prefill_whose_every_request_fails_leaves_the_router_serving(model_dir):
    async with lora_env(model_dir) as env:
        shard = env.shards[0]
        results = await asyncio.gather(
            *(env.client.post("/generate", json=gen(x, "a", 5)) for x in ("A", "AA", "AAA"))
        )
        for r in results:
            await _refused(r)
        await _check_clean(env)
        # The adapter stays known: once its files read again, its requests are served.
        for s in env.shards:
            s.unreadable_adapters = frozenset()
        assert len(await _tokens(env, gen("A", "a", 5))) == 5
        assert [r.adapter_id for r in shard.prefilled].count("a") == 4
        await _check_clean(env)
