"""Chunked prefill in the scheduler, against fake shards: no step computes more prompt tokens
than max_batch_prefill_tokens, long prompts are split over steps while the running requests keep
getting a token every step, and results equal unchunked ones."""

import asyncio
from types import SimpleNamespace

from tests.router.harness import async_test, parse_sse, router_env, wait_until

LONG_PROMPTS = [
    "The quick brown fox jumps over the lazy dog, twice over",
    "Hello world, and hello again to everyone in the room",
    "日本語のテキストも少し長めに書いておきます",
]


def gen(inputs, **params):
    return {"inputs": inputs, "parameters": params}


async def _result(env, body) -> dict:
    r = await env.client.post("/generate", json=body)
    assert r.status == 200, await r.text()
    return await r.json()


@async_test
async def test_steps_stay_within_the_budget_and_running_requests_never_stall(model_dir, tokenizer):
    budget = 8
    async with router_env(
        model_dir, shard={"decode_delay": 0.002}, max_batch_prefill_tokens=budget
    ) as env:
        lengths = [len(tokenizer.encode(p)) for p in LONG_PROMPTS]
        assert min(lengths) > 2 * budget  # each prompt needs several steps
        running = await env.client.post("/generate_stream", json=gen("H", max_new_tokens=60))
        await running.content.readline()
        jobs = [gen(p, max_new_tokens=6, decoder_input_details=True) for p in LONG_PROMPTS]
        concurrent = await asyncio.gather(*(_result(env, j) for j in jobs))
        events = parse_sse(await running.text())
        assert events[-1]["details"]["finish_reason"] == "length"

        shard = env.shards[0]
        prompt_tokens = [sum(step.values()) for step in shard.prompt_chunks]
        assert max(prompt_tokens) == budget
        # Each long prompt was computed over several steps...
        prompt_len = {r.id: len(r.input_ids) for r in shard.prefilled}
        long_ids = [rid for rid, n in prompt_len.items() if n > 2 * budget]
        assert len(long_ids) == len(LONG_PROMPTS)
        for rid in long_ids:
            spread = [step[rid] for step in shard.prompt_chunks if step.get(rid)]
            assert len(spread) > 2 and sum(spread) == prompt_len[rid]
        # ...while the running request got a token at every step from its first to its last.
        first_id = shard.prefilled[0].id
        with_token = [i for i, ids in enumerate(shard.step_generated) if first_id in ids]
        assert with_token == list(range(with_token[0], with_token[-1] + 1))
        assert len(with_token) == 60

        # Details of chunked prompts are whole and equal what unchunked prefill reports.
        for job, result in zip(jobs, concurrent, strict=True):
            prefill = result["details"]["prefill"]
            assert len(prefill) == len(tokenizer.encode(job["inputs"]))
            alone = await _result(env, job)
            assert alone == result
        assert env.violations() == []
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)

    async with router_env(model_dir, prefill_chunking=False) as unchunked:
        for job, result in zip(jobs, concurrent, strict=True):
            assert await _result(unchunked, job) == result


@async_test
async def test_a_budget_smaller_than_the_batch_still_moves_every_prompt(model_dir):
    # Budget 2 with up to five requests running: decode tokens do not use the budget, so every
    # step still computes prompt tokens while any are left.
    async with router_env(model_dir, max_batch_prefill_tokens=2) as env:
        prompts = ["Hello there", "The quick", "abc def ghi", "日本", "xyz"]
        jobs = [gen(p, max_new_tokens=5 + i) for i, p in enumerate(prompts)]
        concurrent = await asyncio.gather(*(_result(env, j) for j in jobs))
        shard = env.shards[0]
        steps = len(shard.prompt_chunks)
        sequential = [await _result(env, j) for j in jobs]
        assert concurrent == sequential
        assert max(shard.decode_sizes) >= 3
        for chunks in shard.prompt_chunks[:steps]:
            assert 0 < sum(chunks.values()) <= 2 or not chunks
        assert env.violations() == []
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)


def test_the_decoding_budget_grows_with_a_wave_of_prompts_and_no_further():
    from router.chunking import DRAIN_STEPS, MAX_GROWTH, decode_step_budget

    chunk = 64
    assert decode_step_budget(chunk, 4096, 0) == chunk
    assert decode_step_budget(chunk, 4096, 128) == chunk  # one arrival: one chunk a step
    assert decode_step_budget(chunk, 4096, 100 * DRAIN_STEPS) == 100
    assert decode_step_budget(chunk, 4096, 10**6) == MAX_GROWTH * chunk
    assert decode_step_budget(chunk, 150, 10**6) == 150  # never past max_batch_prefill_tokens


WAVE = [f"wave number {i}: the quick brown fox jumps over the lazy dog" for i in range(8)]


def test_a_waves_grown_budget_holds_until_the_wave_is_drained():
    from router.chunking import DRAIN_STEPS, WaveBudget

    wave, chunk = WaveBudget(), 64
    left, steps = 15 * 64, []  # 15 prompts of 64 tokens beside decoding requests
    while left:
        steps.append(wave.step(chunk, 4096, left))
        left -= min(left, steps[-1])
    assert steps == [240] * DRAIN_STEPS  # recomputed each step: 240, 180, 135, ... 64
    assert wave.step(chunk, 4096, 0) == chunk
    assert wave.step(chunk, 4096, 128) == chunk  # the next lone arrival: one chunk again


def test_a_step_takes_every_waiting_prompt_when_they_are_many_beside_the_decoders():
    from router.chunking import MAX_GROWTH, WAITING_SHARE, WaveBudget, decoding_budget

    def entry(prompt_left, input_length=100):
        request = SimpleNamespace(input_length=input_length)
        return SimpleNamespace(prompt_left=prompt_left, request=request)

    chunk, max_prefill = 64, 4096
    assert WAITING_SHARE == 0.5
    decoders = [entry(0) for _ in range(8)]
    # 8 decoding, 4 waiting: chunked (grown to drain the 400 tokens in a few steps).
    assert decoding_budget(chunk, max_prefill, decoders, [entry(100)] * 4, WaveBudget()) == 100
    # 8 decoding, 5 waiting (2 admitted mid-prompt, 3 queued): everything at once.
    running = decoders + [entry(40), entry(90)]
    assert (
        decoding_budget(chunk, max_prefill, running, [entry(100)] * 3, WaveBudget()) == max_prefill
    )
    # Many decoders, one long arrival: the chunked cap holds.
    many = [entry(0) for _ in range(16)]
    assert (
        decoding_budget(chunk, max_prefill, many, [entry(5000, 5000)], WaveBudget())
        == MAX_GROWTH * chunk
    )


def _chunked_env(model_dir, chunk: int):
    """A router over a fake shard whose steps take a little time, with a 256-token prefill
    budget and `chunk`-token chunks while requests decode."""
    return router_env(
        model_dir,
        shard={"decode_delay": 0.002},
        max_batch_prefill_tokens=256,
        prefill_chunk_tokens=chunk,
    )


async def _wave_budgets(model_dir, decoders: int, wave: list[str], chunk: int):
    """Prompt tokens of each step in which the first long-running request decoded, with
    `decoders` long requests decoding when `wave` arrives."""
    async with _chunked_env(model_dir, chunk) as env:
        running = [
            await env.client.post("/generate_stream", json=gen(f"H{i}", max_new_tokens=80))
            for i in range(decoders)
        ]
        for r in running:
            await r.content.readline()
        results = await asyncio.gather(*(_result(env, gen(p, max_new_tokens=2)) for p in wave))
        assert all(r["generated_text"] is not None for r in results)
        for r in running:
            await r.text()
        assert env.violations() == []
        shard = env.shards[0]
        first_id = shard.prefilled[0].id
        return [
            sum(chunks.values())
            for chunks, ids in zip(shard.prompt_chunks, shard.step_generated, strict=True)
            if first_id in ids
        ]


@async_test
async def test_a_wave_of_prompts_gets_larger_chunks_while_more_requests_decode(
    model_dir, tokenizer
):
    from router.chunking import DRAIN_STEPS, MAX_GROWTH

    chunk, wave = 2, WAVE[:3]
    pending = sum(len(tokenizer.encode(p)) for p in wave)
    assert pending > DRAIN_STEPS * MAX_GROWTH * chunk  # enough to grow the budget to its cap
    budgets = await _wave_budgets(model_dir, 7, wave, chunk)  # 3 arrivals < 7 decoders / 2
    assert max(budgets) == MAX_GROWTH * chunk


@async_test
async def test_a_wave_that_outnumbers_the_decoders_is_prefilled_at_once(model_dir, tokenizer):
    from router.chunking import MAX_GROWTH

    chunk = 4
    budgets = await _wave_budgets(model_dir, 3, WAVE, chunk)  # 8 arrivals > 3 decoders / 2
    assert max(budgets) > MAX_GROWTH * chunk
    assert max(budgets) <= 256  # max_batch_prefill_tokens


@async_test
async def test_a_lone_prompt_beside_a_decoding_request_gets_the_plain_chunk(model_dir, tokenizer):
    from router.chunking import DRAIN_STEPS

    chunk = 4
    async with _chunked_env(model_dir, chunk) as env:
        running = await env.client.post("/generate_stream", json=gen("H", max_new_tokens=40))
        shard = env.shards[0]
        for _ in range(2):  # two tokens streamed: its prompt is done, it decodes
            while not (await running.content.readline()).startswith(b"data:"):
                pass
        start = len(shard.prompt_chunks)
        prompt = "the quick brown fox jumps"  # more than a chunk, too short to grow the budget
        assert chunk < len(tokenizer.encode(prompt)) <= DRAIN_STEPS * chunk
        await _result(env, gen(prompt, max_new_tokens=2))
        await running.text()
        later = [sum(c.values()) for c in shard.prompt_chunks[start:]]
        assert max(later) == chunk
        assert env.violations() == []
