"""When the shards can no longer serve (a step past --shard-step-timeout, a shard that stopped
itself): every request gets a clear error at once, /health turns 503 naming why, new requests
are refused, and the router's serving loop reports the failure (router/__main__.py exits 4)."""

import asyncio

from router.step_deadlines import WARM_FACTOR, WARM_STEPS, StepDeadlines
from tests.router.harness import async_test, parse_sse, router_env, wait_until

STEP_TIMEOUT_S = 0.3


async def warm_past_the_first_steps(env) -> None:
    """Runs more than WARM_STEPS steps, whose deadlines are longer."""
    body = {"inputs": "warm", "parameters": {"max_new_tokens": WARM_STEPS + 2}}
    r = await env.client.post("/generate", json=body)
    assert r.status == 200, await r.text()


@async_test
async def test_a_hung_step_fails_every_request_and_turns_health_503(model_dir):
    async with router_env(model_dir, shard_step_timeout=STEP_TIMEOUT_S) as env:
        await warm_past_the_first_steps(env)
        assert (await env.client.get("/health")).status == 200
        env.shards[1].hang_next_decode = True
        start = asyncio.get_running_loop().time()
        stream_body = {"inputs": "a", "parameters": {"max_new_tokens": 20}}
        stream, plain = await asyncio.gather(
            env.client.post("/generate_stream", json=stream_body),
            env.client.post("/generate", json=stream_body),
        )
        elapsed = asyncio.get_running_loop().time() - start
        # The deadline, then one Health probe of the silent shard (it answers: a fake's loop).
        assert elapsed < STEP_TIMEOUT_S + 1.5 + 1.0, elapsed
        reason = "Decode did not finish within 0.3 s on shard(s) 1"

        events = parse_sse(await stream.text())
        assert events[-1]["error_type"] == "generation", events
        assert reason in events[-1]["error"] and "stopping" in events[-1]["error"]
        assert events[-1]["request_id"] == stream.headers["x-request-id"]
        assert plain.status == 424
        assert reason in (await plain.json())["error"]

        health = await env.client.get("/health")
        assert health.status == 503
        assert reason in (await health.json())["error"]
        refused = await env.client.post("/generate", json=stream_body)
        assert refused.status == 503, await refused.text()
        body = await refused.json()
        assert body["error_type"] == "unavailable" and reason in body["error"]
        assert env.infer.lost.is_set() and reason in env.infer.failure
        assert "they still answer Health" in env.infer.failure


@async_test
async def test_a_health_probe_waiting_on_a_frozen_shard_answers_503_once_the_shards_are_lost(
    model_dir,
):
    # A frozen shard answers nothing: a /health asked before the loss is known waits on it (up
    # to the probe's 5 s), and must turn 503 when the router learns why, while it still serves.
    async with router_env(model_dir, shard_step_timeout=STEP_TIMEOUT_S) as env:
        await warm_past_the_first_steps(env)
        env.shards[1].hang_health = True
        env.shards[1].hang_next_decode = True
        loop = asyncio.get_running_loop()
        start = loop.time()
        waiting = asyncio.ensure_future(env.client.get("/health"))
        body = {"inputs": "a", "parameters": {"max_new_tokens": 20}}
        failed = await env.client.post("/generate", json=body)
        assert failed.status == 424, await failed.text()
        health = await asyncio.wait_for(waiting, 1.0)
        # The deadline and the 1 s Health probe of the silent shard; not the 5 s /health probe.
        assert loop.time() - start < STEP_TIMEOUT_S + 1.0 + 1.5
        assert health.status == 503, await health.text()
        reason = "do not answer Health either (stopped or frozen)"
        assert reason in (await health.json())["error"]
        assert reason in env.infer.failure


@async_test
async def test_a_shard_that_stops_itself_fails_the_step_at_once(model_dir):
    # No deadline at all: the ABORTED answer alone ends the wait for the other rank.
    async with router_env(model_dir, shard_step_timeout=None) as env:
        await warm_past_the_first_steps(env)
        env.shards[0].hang_next_decode = True  # a peer left waiting in a collective
        env.shards[1].stop_next_decode = True
        r = await env.client.post(
            "/generate", json={"inputs": "a", "parameters": {"max_new_tokens": 5}}
        )
        assert r.status == 424
        error = (await r.json())["error"]
        assert "Decode failed on shard 1, which stopped" in error
        assert "injected" not in error  # the shard's own words stay in the log
        await wait_until(env.infer.lost.is_set)
        assert (await env.client.get("/health")).status == 503


def test_step_deadlines_grow_with_the_step_and_are_longer_at_first():
    deadlines = StepDeadlines(2.0)
    first = [deadlines.next_step(0) for _ in range(WARM_STEPS)]
    assert first == [2.0 * WARM_FACTOR] * WARM_STEPS
    assert deadlines.next_step(0) == 2.0
    assert deadlines.next_step(2048) == 6.0  # one more budget per 1024 tokens
    assert deadlines.between_steps_s == 2.0
    assert StepDeadlines(None).next_step(10_000) is None
