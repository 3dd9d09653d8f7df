"""GET /debug/steps: the scheduler's step timeline, against fake shards that count what each
step computed. Every step the shards ran is a record, with the same prompt tokens and decoding
rows the shards saw, in order, and times that add up."""

import asyncio

from tests.router.harness import async_test, router_env, wait_until


def gen(inputs, **params):
    return {"inputs": inputs, "parameters": params}


@async_test
async def test_the_timeline_matches_the_steps_the_shards_ran(model_dir):
    async with router_env(
        model_dir, shard={"decode_delay": 0.002}, max_batch_prefill_tokens=8
    ) as env:
        start = await (await env.client.get("/debug/steps")).json()
        prompts = ["The quick brown fox jumps over the lazy dog", "Hello", "A longer one, too"]
        results = await asyncio.gather(
            *(env.client.post("/generate", json=gen(p, max_new_tokens=5)) for p in prompts)
        )
        assert all(r.status == 200 for r in results)
        shard, trace_of = env.shards[0], env.infer.batcher.trace
        # A response can reach its client while its last step is still being handled.
        await wait_until(
            lambda: trace_of.snapshot(start["next"])["totals"]["steps"] == len(shard.step_tokens)
        )
        trace = await (await env.client.get(f"/debug/steps?since={start['next']}")).json()

        steps = trace["steps"]
        assert len(steps) == len(shard.step_tokens) > 3
        # What the timeline says each step computed is what the shard computed.
        assert [s["prefill_tokens"] + s["decode_rows"] for s in steps] == shard.step_tokens
        assert [s["step"] for s in steps] == list(range(start["next"], trace["next"]))
        assert sum(s["new_requests"] for s in steps) == len(prompts)
        assert steps[0]["kind"] == "prefill" and steps[0]["new_requests"] >= 1
        assert trace["totals"]["decode_rows"] == sum(s["decode_rows"] for s in steps)
        prompt_tokens = sum(len(r.input_ids) for r in shard.prefilled[-len(prompts) :])
        assert trace["totals"]["prefill_tokens"] == prompt_tokens
        for s in steps:
            assert s["prefill_tokens"] <= 8  # the budget, as the scheduler applied it
            # The fake shard reports no timings; the router's own clocks are real.
            assert s["rpc_s"] > 0 and s["router_s"] >= 0 and s["idle_before_s"] >= 0
        later = [s["start"] for s in steps]
        assert later == sorted(later)

        nothing = await (await env.client.get(f"/debug/steps?since={trace['next']}")).json()
        assert nothing["steps"] == [] and nothing["totals"]["steps"] == 0


@async_test
async def test_a_bad_since_is_a_422_naming_it(model_dir):
    async with router_env(model_dir) as env:
        r = await env.client.get("/debug/steps?since=-3")
        assert r.status == 422
        assert "`since`" in (await r.json())["error"]
