"""A request of several sequences (OpenAI's `n`, `best_of`, several prompts) lives and dies as
one: a client that leaves, or one sequence that fails, releases all of them, their KV blocks
and their concurrency permits, and the router goes on serving."""

from __future__ import annotations

import asyncio
import json

import pytest

from router.entry import ErrorEvent
from router.errors import GenerationError
from router.handlers.choices import Submitted
from tests.router.harness import async_test, router_env, wait_until

COMPLETIONS = "/v1/completions"


def body(**fields):
    return {"model": "m", "prompt": "H", "max_tokens": 200, "ignore_eos": True, **fields}


async def all_released(env) -> None:
    await wait_until(lambda: env.infer.allocator.used_blocks == 0)
    await wait_until(lambda: all(not s.batches for s in env.shards))
    await wait_until(lambda: env.infer.generations.limit.in_flight == 0)
    assert env.violations() == []


@async_test
async def test_a_client_leaving_a_stream_of_several_choices_releases_them_all(model_dir):
    async with router_env(model_dir, served_model_name="m", shard={"decode_delay": 0.01}) as env:
        r = await env.client.post(COMPLETIONS, json=body(n=3, stream=True))
        assert r.status == 200
        await r.content.readline()
        assert env.infer.generations.limit.in_flight == 3
        r.close()
        await all_released(env)

        # A whole answer whose client gives up, with two prompts of two choices each.
        task = asyncio.create_task(env.client.post(COMPLETIONS, json=body(prompt=["H", "I"], n=2)))
        await wait_until(lambda: env.infer.generations.limit.in_flight == 4)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await all_released(env)


@async_test
async def test_one_failing_sequence_fails_the_request_and_its_siblings_are_released(model_dir):
    async with router_env(model_dir, served_model_name="m") as env:
        env.shards[1].fail_next_decode = True
        r = await env.client.post(COMPLETIONS, json=body(n=3, max_tokens=5))
        assert r.status == 424 and (await r.json())["error_type"] == "generation"
        await all_released(env)

        env.shards[0].fail_next_decode = True
        r = await env.client.post(COMPLETIONS, json=body(n=2, max_tokens=5, stream=True))
        assert r.status == 200
        lines = [line for line in (await r.text()).splitlines() if line.startswith("data: ")]
        assert json.loads(lines[-1][6:])["error_type"] == "generation"  # then the stream ends
        await all_released(env)

        r = await env.client.post(COMPLETIONS, json=body(n=2, max_tokens=3))
        assert r.status == 200
        assert [c["text"] for c in (await r.json())["choices"]] == ["IJK", "IJK"]


@async_test
async def test_sequences_count_against_the_concurrency_limit(model_dir):
    async with router_env(
        model_dir, served_model_name="m", shard={"decode_delay": 0.01}, max_concurrent_requests=3
    ) as env:
        r1 = await env.client.post(COMPLETIONS, json=body(n=2, max_tokens=30, stream=True))
        await r1.content.readline()
        r2 = await env.client.post(COMPLETIONS, json=body(n=2, max_tokens=2))
        assert r2.status == 429  # 2 + 2 > 3: no room now, unlike a request that could never fit
        r3 = await env.client.post(COMPLETIONS, json=body(n=1, max_tokens=2))
        assert r3.status == 200
        r1.close()
        await all_released(env)


class _Entry:
    """What Submitted reads of an entry: its events, done, cancel."""

    def __init__(self, entry_id: int) -> None:
        self.id, self.done, self.cancelled = entry_id, False, False
        self.events: asyncio.Queue = asyncio.Queue()

    def cancel(self) -> None:
        self.cancelled = True  # as Entry.cancel: no further event comes


@async_test
async def test_one_failure_cancels_the_siblings_and_leaves_no_task_waiting_on_them():
    entries = [_Entry(i) for i in range(3)]
    sent = Submitted(candidates=[entries])
    entries[1].events.put_nowait(ErrorEvent(GenerationError("boom")))
    with pytest.raises(GenerationError):
        await sent.finished()
    assert [e.cancelled for e in entries] == [True, True, True]
    await asyncio.sleep(0)
    waiting = [t for t in asyncio.all_tasks() if "wait_finished" in repr(t.get_coro())]
    assert waiting == []
