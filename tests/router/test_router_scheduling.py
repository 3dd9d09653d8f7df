"""Scheduling with TGI's semantics against fake shards: continuous admission into a running batch,
waiting_served_ratio / max_waiting_tokens, max_batch_size, FIFO under a full KV cache, and
concurrent results equal to sequential ones.
"""

import asyncio

import pytest

from tests.router.harness import async_test, parse_sse, router_env, wait_until


def gen(inputs="H", **params):
    return {"inputs": inputs, "parameters": params}


async def _text(env, body) -> str:
    r = await env.client.post("/generate", json=body)
    assert r.status == 200, await r.text()
    return (await r.json())["generated_text"]


def _decodes_before_last_prefill(calls: list[str], since: int) -> tuple[int, int]:
    """Decode calls before the last Prefill: since the one before it, and since index `since`."""
    prefills = [i for i, c in enumerate(calls) if c == "Prefill"]
    between = calls[prefills[-2] : prefills[-1]].count("Decode")
    return between, calls[since : prefills[-1]].count("Decode")


@pytest.mark.parametrize("chunking,reason", [(True, "chunked"), (False, "backpressure")])
@async_test
async def test_a_long_running_batch_keeps_admitting_new_requests(model_dir, chunking, reason):
    async with router_env(
        model_dir, shard={"decode_delay": 0.005}, prefill_chunking=chunking
    ) as env:
        long = await env.client.post("/generate_stream", json=gen(max_new_tokens=100))
        assert (await long.content.readline()).startswith(b"data:")
        jobs = [
            gen("Hello", max_new_tokens=5),
            gen("The quick", max_new_tokens=8, stop=["zz"]),
            gen("a", max_new_tokens=6, do_sample=True, seed=3, top_k=5),
            gen("日本", max_new_tokens=7, repetition_penalty=1.2),
        ]
        concurrent = await asyncio.gather(*(_text(env, j) for j in jobs))
        # They all finished while the long request was still generating.
        assert len(env.infer.batcher.entries) == 1
        assert max(env.shards[0].decode_sizes) >= 2  # decoded together with the long one
        assert env.infer.metrics.concat.labels(reason=reason)._value.get() >= 1
        sequential = [await _text(env, j) for j in jobs]
        assert concurrent == sequential
        events = parse_sse(await long.text())  # the first event was read above
        assert len(events) == 99 and events[-1]["details"]["finish_reason"] == "length"
        assert events[-1]["generated_text"] == await _text(env, gen(max_new_tokens=100))
        assert env.violations() == []
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)


async def _late_join_decodes(model_dir, **flags) -> tuple[int, int]:
    """Runs 4 long requests, then one late one; counts the decodes before it joined."""
    async with router_env(
        model_dir, shard={"decode_delay": 0.005}, prefill_chunking=False, **flags
    ) as env:
        streams = [
            await env.client.post("/generate_stream", json=gen(p, max_new_tokens=120))
            for p in ("H", "A", "a", "0")
        ]
        for s in streams:
            await s.content.readline()
        await wait_until(lambda: len(env.infer.batcher.entries) == 4)
        # Counted from when the late request is queued, not sent: on a loaded machine its
        # HTTP handling and tokenization may take longer than a decode step.
        queued_at: list[int] = []
        queue_append = env.infer.queue.append

        def append(entry) -> None:
            queued_at.append(len(env.shards[0].calls))
            queue_append(entry)

        env.infer.queue.append = append
        assert await _text(env, gen(max_new_tokens=2)) == "IJ"
        arrived = queued_at[0]
        for s in streams:
            s.close()
        assert env.violations() == []
        return _decodes_before_last_prefill(env.shards[0].calls, arrived)


@async_test
async def test_waiting_served_ratio_and_max_waiting_tokens(model_dir):
    # TGI without chunking: a prefill interrupts the running batch only for >= ratio * batch
    # size requests, or once max_waiting_tokens decode steps went by without one.
    _, waited = await _late_join_decodes(model_dir, waiting_served_ratio=0.25)  # 1 >= 0.25 * 4
    assert waited <= 1
    # 1 < 1.0 * 4: the late request waits until 20 - 1 decodes followed the last prefill.
    since_prefill, waited = await _late_join_decodes(
        model_dir, waiting_served_ratio=1.0, max_waiting_tokens=20
    )
    assert since_prefill == 19 and waited > 5


@async_test
async def test_max_batch_size_bounds_the_batch(model_dir):
    async with router_env(model_dir, max_batch_size=2) as env:
        prompts = ["H", "A", "a", "0", "Hello"]
        texts = await asyncio.gather(*(_text(env, gen(p, max_new_tokens=9)) for p in prompts))
        assert max(env.shards[0].decode_sizes) == 2
        assert texts == [await _text(env, gen(p, max_new_tokens=9)) for p in prompts]
        info = await (await env.client.get("/info")).json()
        assert info["max_batch_size"] == 2
        assert env.violations() == []


@async_test
async def test_fifo_a_small_request_never_overtakes_one_waiting_for_blocks(model_dir):
    # 40 blocks of 4 tokens, one reserved: 156 tokens. A and B need 25 blocks each.
    async with router_env(
        model_dir, shard={"num_blocks": 40, "decode_delay": 0.005}, max_total_tokens=100
    ) as env:
        a = await env.client.post("/generate_stream", json=gen("H", max_new_tokens=99))
        await a.content.readline()
        b = asyncio.create_task(_text(env, gen("A", max_new_tokens=99)))
        await wait_until(lambda: len(env.infer.queue) == 1)
        c = asyncio.create_task(_text(env, gen("a", max_new_tokens=2)))  # 3 blocks: would fit
        await wait_until(lambda: len(env.infer.queue) == 2)
        await asyncio.sleep(0.1)
        assert len(env.infer.queue) == 2  # C waits behind B although it fits
        await a.text()
        await asyncio.gather(b, c)
        order = [r.input_ids[0] for r in env.shards[0].prefilled]
        tok = env.infer.tokenizer.decoder
        assert order == [tok.encode(p)[0] for p in ("H", "A", "a")]
        assert env.violations() == []
