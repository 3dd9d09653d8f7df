"""Speculative decoding, the router's side, over fake shards that verify proposals as the real
shard does (tests/router/fake_shard.py): proposals go only with decoding requests and within
their reserved slots, are switched off by batch size, an accepted run streams as separate token
events in order, a stop inside it ends the request there, and the acceptance is counted.

The tests' tokenizer maps "A".."Z" to ids 36..61, and the fake's next token is the last one + 1
(or its `script`), so prompt lookup's proposals and the fake's answers can be worked out by
hand: with "ABCDEFGHIJABC" the request generates D (39), E, F... and after "ABCD" the prompt
says "EFGH..." again.
"""

from __future__ import annotations

import asyncio

from router.speculation.config import SpeculativeConfig
from tests.router.harness import async_test, parse_sse, router_env, scrape, wait_until

# Windows of 2 and 3 tokens: the tests' sequences repeat shortly.
SPEC = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=3)
PROMPT = "ABCDEFGHIJABC"


def gen(inputs: str, **params) -> dict:
    return {"inputs": inputs, "parameters": {"details": True, **params}}


async def generate(env, body) -> dict:
    response = await env.client.post("/generate", json=body)
    assert response.status == 200, await response.text()
    return await response.json()


def steps_with(shard, kind: str) -> list[int]:
    """Indexes (into the per-step records) of the Prefill or Decode steps."""
    steps = [c for c in shard.calls if c in ("Prefill", "Decode")]
    return [i for i, c in enumerate(steps) if c == kind]


@async_test
async def test_accepted_runs_stream_in_order_and_are_counted(model_dir):
    async with router_env(model_dir, speculative_config=SPEC) as env:
        response = await env.client.post(
            "/generate_stream", json=gen(PROMPT, max_new_tokens=12, top_n_tokens=2)
        )
        events = parse_sse(await response.text())
        ids = [e["token"]["id"] for e in events]
        assert ids == list(range(39, 51))  # D..O: the same tokens as one step at a time
        assert events[-1]["generated_text"] == "DEFGHIJKLMNO"
        assert all(len(e["top_tokens"]) == 2 for e in events)
        assert [e["details"] is not None for e in events] == [False] * 11 + [True]
        shard = env.shards[0]
        rid = shard.prefilled[-1].id
        # The prompt step proposes nothing; then "B C D" -> "E F G H" (all accepted, the fake
        # samples I after them), "G H I" -> "J A B C" (J accepted, K sampled), then no match.
        assert (
            shard.step_proposals
            == [{}, {rid: [40, 41, 42, 43]}, {rid: [45, 36, 37, 38]}] + [{}] * 4
        )
        # The step timeline and the deadlines count a proposal's tokens with its row's.
        assert shard.step_tokens == [13, 5, 5, 1, 1, 1, 1]
        # The last step's record closes once its answer is handled, after the stream's end.
        await wait_until(lambda: len(env.infer.batcher.trace.records) == len(shard.step_tokens))
        trace = (await (await env.client.get("/debug/steps")).json())["steps"]
        computed = [s["prefill_tokens"] + s["decode_rows"] + s["proposed_tokens"] for s in trace]
        assert computed == shard.step_tokens
        assert [s["accepted_tokens"] for s in trace] == [0, 4, 1, 0, 0, 0, 0]
        metrics = await scrape(env.client)
        assert metrics["switchyard_spec_decode_num_drafts_total"] == 2
        assert metrics["switchyard_spec_decode_num_draft_tokens_total"] == 8
        assert metrics["switchyard_spec_decode_num_accepted_tokens_total"] == 5
        assert metrics["switchyard_spec_decode_num_emitted_tokens_total"] == 7
        per_pos = [
            metrics[f'switchyard_spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}']
            for i in range(4)
        ]
        assert per_pos == [2, 1, 1, 1]
        assert metrics["switchyard_generated_tokens_total"] == 12
        info = await (await env.client.get("/info")).json()
        assert info["speculate"] == 4
        assert env.violations() == []
    async with router_env(model_dir) as plain:
        reference = await generate(plain, gen(PROMPT, max_new_tokens=12, top_n_tokens=2))
        assert all(p == {} for p in plain.shards[0].step_proposals)
        info = await (await plain.client.get("/info")).json()
        assert info["speculate"] == 0
    async with router_env(model_dir, speculative_config=SPEC) as env:
        assert await generate(env, gen(PROMPT, max_new_tokens=12, top_n_tokens=2)) == reference


@async_test
async def test_proposals_stay_within_the_reserved_slots(model_dir):
    async with router_env(model_dir, speculative_config=SPEC) as env:
        # max_new_tokens 4: after D, 2 proposed tokens can still be useful (E F, then G is
        # sampled after them, the 4th token); 4 would fit the slots but not the request.
        out = await generate(env, gen(PROMPT, max_new_tokens=4))
        assert out["generated_text"] == "DEFG"
        rid = env.shards[0].prefilled[-1].id
        assert env.shards[0].step_proposals == [{}, {rid: [40, 41]}]
        # max_new_tokens 2: the step after the first token may produce only the last one.
        out = await generate(env, gen(PROMPT, max_new_tokens=2))
        assert out["generated_text"] == "DE"
        assert env.shards[0].step_proposals[2:] == [{}, {}]
        assert env.violations() == []


@async_test
async def test_a_stop_sequence_inside_an_accepted_run_ends_the_request_there(model_dir):
    async with router_env(model_dir, speculative_config=SPEC) as env:
        response = await env.client.post(
            "/generate_stream", json=gen(PROMPT, max_new_tokens=20, stop=["FG"])
        )
        events = parse_sse(await response.text())
        # The shard accepted E F G H and sampled I in one step; the text stops at G.
        rid = env.shards[0].prefilled[-1].id
        assert env.shards[0].step_proposals == [{}, {rid: [40, 41, 42, 43]}]
        assert [e["token"]["text"] for e in events] == ["D", "E", "F", "G"]
        assert events[-1]["details"]["finish_reason"] == "stop_sequence"
        assert events[-1]["generated_text"] == "DEFG"
        assert events[-1]["details"]["generated_tokens"] == 4
        metrics = await scrape(env.client)
        # Acceptance is the shards' verdict, whatever the router kept of it.
        assert metrics["switchyard_spec_decode_num_accepted_tokens_total"] == 4
        assert metrics["switchyard_generated_tokens_total"] == 4
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)
        assert env.infer.batcher.speculator._proposers == {}
        assert env.violations() == []


@async_test
async def test_eos_inside_an_accepted_run_ends_the_request_there(model_dir):
    async with router_env(model_dir, speculative_config=SPEC, served_model_name="fake") as env:
        # Token ids 510 511 0 1 2(EOS) 7 510: the fake's next token after 511 is 0 (it wraps),
        # then 1, then EOS; prompt lookup proposes 0 1 2 after "510 511", cut after the EOS.
        body = {"model": "fake", "prompt": [510, 511, 0, 1, 2, 7, 510], "max_tokens": 10}
        response = await env.client.post("/v1/completions", json=body)
        assert response.status == 200, await response.text()
        out = await response.json()
        rid = env.shards[0].prefilled[-1].id
        assert env.shards[0].step_proposals == [{}, {rid: [0, 1, 2]}]
        # 511, then 0 1 EOS accepted in one step (the token sampled after EOS is dropped).
        assert out["choices"][0]["finish_reason"] == "stop"
        assert out["usage"]["completion_tokens"] == 4
        assert env.violations() == []


@async_test
async def test_disabled_by_batch_size_and_sent_with_a_prefill(model_dir):
    """With disable_by_batch_size 2: a lone decoding request takes proposals, also in the
    Prefill that starts another request beside it (its row decodes in that step); while both
    decode, nobody does; once one is done the other takes them again."""
    spec = SpeculativeConfig(
        num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=3, disable_by_batch_size=2
    )
    # Every request generates A B C D A B C D ..., which its prompt predicts.
    shard = {"script": (36, 37, 38, 39), "decode_delay": 0.02}
    async with router_env(model_dir, speculative_config=spec, shard=shard) as env:
        long = await env.client.post("/generate_stream", json=gen("ABCDABCD", max_new_tokens=80))
        assert (await long.content.readline()).startswith(b"data:")
        short = await generate(env, gen("ABCDABCD", max_new_tokens=6))
        assert short["generated_text"] == "ABCDAB"
        events = parse_sse((await long.content.read()).decode())
        assert len(events) == 79 and events[-1]["generated_text"] == "ABCD" * 20
        fake = env.shards[0]
        pairs = list(zip(fake.step_decoding, fake.step_proposals, strict=True))
        assert all(not proposed for decoding, proposed in pairs if decoding >= 2)
        both = [i for i, (decoding, _) in enumerate(pairs) if decoding >= 2]
        assert both, "the two requests never decoded together"
        assert any(proposed for _, proposed in pairs[: both[0]])  # alone before
        assert any(proposed for _, proposed in pairs[both[-1] + 1 :])  # and after
        prefills = steps_with(fake, "Prefill")
        long_id = fake.prefilled[0].id
        assert prefills[1] > 0 and long_id in fake.step_proposals[prefills[1]]
        assert env.violations() == []


@async_test
async def test_constrained_requests_get_masks_for_their_proposals(model_dir):
    """A regex grammar over the fake shard (which samples the first token its mask allows from
    its own next token on): proposals carry one mask per token, the text is the one the same
    fake gives without speculation, and some proposals are accepted."""
    body = gen(
        "abcabcabcabc",
        max_new_tokens=24,
        grammar={"type": "regex", "value": "(abc){6}"},
    )
    async with router_env(model_dir) as plain:
        reference = await generate(plain, body)
    async with router_env(model_dir, speculative_config=SPEC) as env:
        out = await generate(env, body)
        assert out == reference
        assert out["generated_text"] == "abc" * 6
        proposed = [p for step in env.shards[0].step_proposals for p in step.values()]
        assert proposed, "nothing was proposed"
        metrics = await scrape(env.client)
        assert metrics["switchyard_spec_decode_num_accepted_tokens_total"] > 0
        assert env.violations() == []  # one mask per proposed token, every step


@async_test
async def test_a_shard_answer_that_contradicts_the_proposal_fails_the_request(model_dir):
    async with router_env(model_dir, speculative_config=SPEC) as env:
        batcher = env.infer.batcher
        verify = batcher.speculator.verify

        def corrupt(entry, generation):
            if len(generation.tokens.ids) > 1:  # claims a proposed token it did not sample
                generation.tokens.ids[0] += 1
            return verify(entry, generation)

        batcher.speculator.verify = corrupt
        response = await env.client.post("/generate", json=gen(PROMPT, max_new_tokens=12))
        assert response.status == 424
        assert "proposed tokens" in (await response.json())["error"]
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)
        await asyncio.sleep(0)


@async_test
async def test_proposals_stop_short_of_the_longrope_boundary(model_dir):
    """A short prompt's sequence crossing rope_regime_boundary (20) is recomputed in the step
    that feeds position 20; proposals never reach it (the fake flags one that does)."""
    body = gen(PROMPT, max_new_tokens=20)
    shard = {"rope_regime_boundary": 20}
    async with router_env(model_dir, shard=shard) as plain:
        reference = await generate(plain, body)
    async with router_env(model_dir, speculative_config=SPEC, shard=shard) as env:
        assert await generate(env, body) == reference
        rid = env.shards[0].prefilled[-1].id
        # Fed position 13: E F G H at 14..17; fed position 18: only J at 19; then position 20.
        assert env.shards[0].step_proposals[:4] == [{}, {rid: [40, 41, 42, 43]}, {rid: [45]}, {}]
        assert env.violations() == []
