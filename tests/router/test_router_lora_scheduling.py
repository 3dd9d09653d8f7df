"""The --max-loras admission rule against fake shards that flag any step holding more distinct
adapters than their slots: a request for another adapter waits for a slot, which one live
adapter frees for it by draining (first come first served across adapters); the base model's
requests and those of the other live adapters are not held up meanwhile."""

import asyncio

import pytest

from router.adapters import LoraAdapter
from tests.router.harness import async_test, router_env, wait_until

ADAPTERS = tuple(LoraAdapter(n, f"/adapters/{n}") for n in ("a", "b", "c"))


def lora_env(model_dir, max_loras: int, **args):
    return router_env(
        model_dir,
        shard={"decode_delay": 0.005, "max_loras": max_loras},
        lora_adapters=ADAPTERS,
        max_loras=max_loras,
        **args,
    )


def gen(inputs: str, adapter: str, n: int) -> dict:
    return {"inputs": inputs, "parameters": {"max_new_tokens": n, "adapter_id": adapter}}


async def _generate(env, body) -> int:
    r = await env.client.post("/generate", json=body)
    assert r.status == 200, await r.text()
    return r.status


@pytest.mark.parametrize("chunking", [True, False])
@async_test
async def test_a_third_adapter_gets_the_slot_a_draining_adapter_frees(model_dir, chunking):
    async with lora_env(model_dir, 2, prefill_chunking=chunking) as env:
        shard, batcher = env.shards[0], env.infer.batcher
        # Two adapters fill both slots: A ends well before B.
        a = await env.client.post("/generate_stream", json=gen("A", "a", 80))
        b = await env.client.post("/generate_stream", json=gen("B", "b", 160))
        for stream in (a, b):
            assert (await stream.content.readline()).startswith(b"data:")
        assert batcher.adapters.live() == {"a", "b"}

        c = asyncio.create_task(_generate(env, gen("C", "c", 3)))
        await wait_until(lambda: batcher.adapters.draining == "a")  # a was live first
        # Behind C: the base model and live adapter b go ahead (they need no new slot); a
        # request for a waits, since a is draining for C, which came first.
        d = asyncio.create_task(_generate(env, gen("D", "", 3)))
        e = asyncio.create_task(_generate(env, gen("E", "b", 3)))
        f = asyncio.create_task(_generate(env, gen("F", "a", 3)))
        assert await d == 200 and await e == 200
        assert batcher.adapters.live() == {"a", "b"}
        assert [r.adapter_id for r in shard.prefilled] == ["a", "b", "", "b"]
        assert len(env.infer.queue) == 2  # C and F

        assert await c == 200 and await f == 200
        await a.read()
        await b.read()

        assert env.violations() == []  # the fake shards saw at most 2 adapters in every step
        assert max(len(s) for s in shard.step_adapters) == 2
        # C started only once A's last request had left the shards, while B was still running,
        # and F (for a again, after C) only after that.
        first_c = next(i for i, s in enumerate(shard.step_adapters) if "c" in s)
        assert all("a" not in s for s in shard.step_adapters[first_c : first_c + 1])
        assert {"b", "c"} in shard.step_adapters[first_c:]  # C ran beside B
        assert [r.adapter_id for r in shard.prefilled] == ["a", "b", "", "b", "c", "a"]
        assert batcher.adapters.distinct == 0 and batcher.adapters.draining is None
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)


@async_test
async def test_live_adapters_share_their_slot_and_the_base_model_needs_none(model_dir):
    async with lora_env(model_dir, 1) as env:
        shard = env.shards[0]
        jobs = [gen("A", "a", 30), gen("H", "a", 30), gen("X", "", 30), gen("Y", "", 30)]
        streams = [await env.client.post("/generate_stream", json=j) for j in jobs]
        for s in streams:
            assert (await s.content.readline()).startswith(b"data:")
        # All four decode together with one slot: one adapter, and the base model.
        await wait_until(lambda: len(env.infer.batcher.entries) == 4)
        assert env.infer.batcher.adapters.live() == {"a"}
        for s in streams:
            await s.read()
        assert max(shard.decode_sizes) == 4
        assert {frozenset({"a"})} == {s for s in shard.step_adapters if s}
        assert env.violations() == []


@async_test
async def test_cancelled_and_failed_requests_give_their_slot_back(model_dir):
    async with lora_env(model_dir, 1) as env:
        live = env.infer.batcher.adapters
        # Cancelled: the client of adapter a's only request goes away while b waits for the slot.
        a = await env.client.post("/generate_stream", json=gen("A", "a", 200))
        assert (await a.content.readline()).startswith(b"data:")
        b = asyncio.create_task(_generate(env, gen("B", "b", 3)))
        await wait_until(lambda: len(env.infer.queue) == 1)
        assert live.live() == {"a"}
        a.close()
        assert await b == 200

        # Failed in Prefill (only rank 0 fails; the router clears both).
        env.shards[0].fail_prefill_token = 72  # "e"
        r = await env.client.post("/generate", json=gen("Hello", "a", 3))
        assert r.status == 424
        env.shards[0].fail_prefill_token = None
        assert live.distinct == 0

        # Failed in Decode, mid-stream.
        a = await env.client.post("/generate_stream", json=gen("A", "a", 200))
        assert (await a.content.readline()).startswith(b"data:")
        env.shards[0].fail_next_decode = True
        assert b"generation" in await a.read()
        await wait_until(lambda: live.distinct == 0)
        assert await _generate(env, gen("B", "b", 3)) == 200
        assert env.violations() == []
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)
