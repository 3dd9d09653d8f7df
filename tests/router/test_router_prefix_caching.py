"""Automatic prefix caching through the HTTP API, against fake shards that model the KV cache
(tests/router/fake_shard.py): a cached prefix must hold exactly the request's own K/V, shared
blocks are never written, and every block comes back."""

import asyncio
import random

import pytest

from tests.router.harness import async_test, parse_sse, router_env, scrape, wait_until

SYSTEM = "You are a terse assistant. Answer in one word, always politely. "


def gen(inputs, **params):
    return {"inputs": inputs, "parameters": params}


async def generate(env, body) -> tuple[dict, dict]:
    r = await env.client.post("/generate", json=body)
    assert r.status == 200, await r.text()
    return await r.json(), dict(r.headers)


def expected_text(tokenizer, prompt: str, n: int, vocab: int = 512) -> str:
    """The fake shard's answer: token ids counting up from the prompt's last one."""
    last = tokenizer.encode(prompt)[-1]
    return tokenizer.decode([(last + 1 + k) % vocab for k in range(n)], skip_special_tokens=True)


@pytest.mark.parametrize("caching", [True, False])
@async_test
async def test_a_shared_system_prompt_is_read_from_the_cache(model_dir, tokenizer, caching):
    async with router_env(model_dir, prefix_caching=caching) as env:
        info = await (await env.client.get("/info")).json()
        assert info["prefix_caching"] is caching
        first, h1 = await generate(env, gen(SYSTEM + "Sky?", max_new_tokens=3))
        second, h2 = await generate(env, gen(SYSTEM + "Grass?", max_new_tokens=3))
        assert second["generated_text"] == expected_text(tokenizer, SYSTEM + "Grass?", 3)
        assert h1["x-prompt-cached-tokens"] == "0"
        shared = len(tokenizer.encode(SYSTEM)) // 4 * 4  # whole 4-token blocks
        cached = int(h2["x-prompt-cached-tokens"])
        assert (cached >= shared - 4 and cached % 4 == 0) if caching else cached == 0
        assert [r.prefix_len for r in env.shards[0].prefilled] == [0, cached]
        m = await scrape(env.client)
        prompt = sum(len(tokenizer.encode(SYSTEM + q)) for q in ("Sky?", "Grass?"))
        assert m["switchyard_prompt_tokens_cached_total"] == cached
        assert m["switchyard_prompt_tokens_computed_total"] == prompt - cached
        assert (m["switchyard_prefix_cache_blocks"] > 0) is caching
        assert env.violations() == []


@async_test
async def test_openai_usage_reports_cached_tokens_and_prompt_logprobs_skip_the_cache(
    model_dir, tokenizer
):
    async with router_env(model_dir) as env:
        body = {"prompt": SYSTEM + "Sea?", "max_tokens": 2}
        r = await env.client.post("/v1/completions", json=body)
        assert (await r.json())["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        r = await env.client.post("/v1/completions", json=body)
        usage = (await r.json())["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0
        assert usage["prompt_tokens"] == len(tokenizer.encode(SYSTEM + "Sea?"))
        # Prompt logprobs need every prompt position computed: no cached prefix, all details.
        result, headers = await generate(
            env, gen(SYSTEM + "Sea?", max_new_tokens=2, details=True, decoder_input_details=True)
        )
        assert headers["x-prompt-cached-tokens"] == "0"
        assert len(result["details"]["prefill"]) == usage["prompt_tokens"]
        assert env.shards[0].prefilled[-1].prefix_len == 0
        assert env.violations() == []


@pytest.mark.parametrize("caching", [True, False])
@async_test
async def test_shared_blocks_count_once_against_the_batch_token_budget(model_dir, caching):
    # 60 tokens each; a second copy that shares its prompt's blocks costs only its tail.
    prompt = "a" * 40
    async with router_env(
        model_dir,
        shard={"decode_delay": 0.01},
        max_batch_total_tokens=100,
        max_total_tokens=64,
        prefix_caching=caching,
    ) as env:
        first = await env.client.post("/generate_stream", json=gen(prompt, max_new_tokens=20))
        await first.content.readline()  # its prompt is computed (and cached)
        second, _ = await generate(env, gen(prompt, max_new_tokens=20))
        assert len(parse_sse(await first.text())) == 19  # the first one was read above
        together = max(env.shards[0].decode_sizes)
        assert together == (2 if caching else 1)
        assert env.violations() == []


@async_test
async def test_random_shared_prefixes_under_memory_pressure_lose_nothing(model_dir, tokenizer):
    """Many conversations over few KV blocks: cached prefixes are evicted and reused all the
    time, every answer is still right, no block is written while shared, all come back."""
    rng = random.Random(7)
    heads = ["", SYSTEM, SYSTEM + "Context: cats. ", "Translate: "]
    jobs = []
    for _ in range(40):
        prompt = rng.choice(heads) + " ".join(
            rng.choice(["yes", "no", "maybe"]) for _ in range(rng.randrange(1, 8))
        )
        jobs.append((prompt, rng.randrange(1, 12), rng.random() < 0.15))
    async with router_env(
        model_dir,
        shard={"decode_delay": 0.001},
        max_batch_total_tokens=240,
        max_total_tokens=100,
        max_batch_prefill_tokens=24,
    ) as env:

        async def one(prompt, n, details, delay):
            await asyncio.sleep(delay)
            body = gen(prompt, max_new_tokens=n, decoder_input_details=details, details=details)
            return await generate(env, body)

        results = await asyncio.gather(*(one(p, n, d, rng.random() * 0.3) for p, n, d in jobs))
        for (prompt, n, _), (result, _) in zip(jobs, results, strict=True):
            assert result["generated_text"] == expected_text(tokenizer, prompt, n), prompt
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)
        m = await scrape(env.client)
        assert m["switchyard_prompt_tokens_cached_total"] > 0
        assert m["switchyard_prefix_cache_evictions_total"] > 0
        assert m["switchyard_kv_blocks_free"] == m["switchyard_kv_blocks_total"]
        assert env.violations() == []


def text_of_tokens(tokenizer, n: int) -> str:
    for end in range(len(SYSTEM * 2)):
        if len(tokenizer.encode((SYSTEM * 2)[:end])) == n:
            return (SYSTEM * 2)[:end]
    raise AssertionError(f"no prefix of {n} tokens")


@async_test
async def test_a_prompt_still_being_computed_shares_only_its_finished_blocks(model_dir, tokenizer):
    """6 prompt tokens a step, 4-token blocks: A computes 6, 12, 18, then its last 4 beside
    B's first 2. When B is admitted A has computed 18 tokens, inside its fifth block: B may
    share the four full ones (16 tokens), never the one A is still writing."""
    prompt = text_of_tokens(tokenizer, 22)
    async with router_env(
        model_dir, shard={"decode_delay": 0.02}, max_batch_prefill_tokens=6
    ) as env:
        first = asyncio.create_task(generate(env, gen(prompt, max_new_tokens=2)))
        await wait_until(lambda: env.shards[0].prefilled)
        second, _ = await generate(env, gen(prompt, max_new_tokens=2))
        await first
        a, b = env.shards[0].prefilled
        assert [step.get(a.id) for step in env.shards[0].prompt_chunks[:4]] == [6, 6, 6, 4]
        assert b.prefix_len == 16
        assert second["generated_text"] == expected_text(tokenizer, prompt, 2)
        assert env.violations() == []  # B found exactly A's K/V in every block it shared


async def complete(env, prompt: list[int], max_tokens: int = 2) -> int:
    """Completes a prompt of token ids; returns its cached prompt tokens."""
    r = await env.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens})
    assert r.status == 200, await r.text()
    return (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"]


@async_test
async def test_longrope_prompts_share_blocks_only_with_prompts_on_their_side_of_the_boundary(
    model_dir,
):
    """Shards whose rope tables switch past 32 tokens (longrope): a prompt longer than that has
    every K rotated with the long tables, a shorter one with the short tables. The fake shard
    models that in each slot's content, so a block shared across the boundary is a violation."""
    async with router_env(model_dir, shard={"rope_regime_boundary": 32, "block_size": 16}) as env:
        q = list(range(100, 150))
        assert await complete(env, q[:20]) == 0  # short
        assert await complete(env, q[:20] + [7]) == 16  # short with short
        assert await complete(env, q[:40]) == 0  # long: not the short one's block
        assert await complete(env, q[:40] + [7]) == 32  # long with long
        # Exactly 32 is short (not the long blocks), and so may grow past 32: private.
        assert await complete(env, q[:32]) == 0
        assert await complete(env, q[:31], max_tokens=1) == 16  # short with short, no crossing
        r = list(range(200, 250))
        assert await complete(env, r[:40]) == 0  # long first
        assert await complete(env, r[:20]) == 0  # short: not the long one's block
        assert await complete(env, r[:20] + [7]) == 16
        # A short prompt generating past the boundary: the shards recompute it with the long
        # tables there, so it named no block; neither a long prompt nor a short one reads any.
        s = list(range(300, 330))
        assert await complete(env, s, max_tokens=20) == 0
        answer = s + [(s[-1] + 1 + k) % 512 for k in range(20)]
        assert await complete(env, answer[:48] + [7]) == 0
        assert await complete(env, answer[:31], max_tokens=1) == 0
        assert env.violations() == []


@async_test
async def test_longrope_requests_that_may_cross_the_boundary_neither_read_nor_fill_the_cache(
    model_dir,
):
    """A prompt of at most 32 tokens that may generate past 32 is recomputed whole with the
    long tables at the crossing (the fake shard rewrites every slot it holds, as the real shard
    does): it may neither read cached blocks (it would rewrite them under their other readers)
    nor name its own (their K/V change at the crossing). Requests that cannot cross cache as
    before, and the shards' blocks hold what their names promise throughout."""
    async with router_env(model_dir, shard={"rope_regime_boundary": 32, "block_size": 16}) as env:
        q = list(range(100, 140))
        assert await complete(env, q[:20], max_tokens=12) == 0  # 32 positions: cannot cross
        assert await complete(env, q[:20] + [7], max_tokens=11) == 16  # neither: reads it
        # 33 positions: its last token sits at 32 and never runs, so it cannot cross either
        assert await complete(env, q[:20] + [9], max_tokens=12) == 16
        assert await complete(env, q[:20] + [8], max_tokens=13) == 0  # 34: may cross, no read
        # The first one's block is still there for a short request that cannot cross.
        assert await complete(env, q[:20] + [8] + q[21:31], max_tokens=1) == 16
        c = list(range(200, 230))
        crossed = c + [(c[-1] + 1 + k) % 512 for k in range(20)]
        assert await complete(env, c, max_tokens=20) == 0  # crosses at its 3rd token
        assert await complete(env, crossed[:17], max_tokens=1) == 0  # its first block: unnamed
        assert await complete(env, crossed[:48] + [7]) == 0  # long: nothing either
        assert await complete(env, crossed[:17], max_tokens=1) == 16  # the one before named it
        # Long prompts never cross: they cache as before.
        assert await complete(env, crossed[:40] + [7], max_tokens=30) == 32
        m = await scrape(env.client)
        assert m["switchyard_prefix_cache_blocks"] > 0
        assert env.violations() == []
