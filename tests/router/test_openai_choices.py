"""OpenAI's several sequences per request, end to end (the real router over a real shard):
`n` choices, `best_of` candidates, several prompts and token id prompts on /v1/completions,
`echo` with the prompt's logprobs, `n` on chat; whole and streamed. Greedy answers against
transformers on the same weights; sampled choices against the same request sent alone with
each choice's seed."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from launcher.tiny_models import build_model
from tests.router.harness import real_router_env
from tests.shard.servicer_helpers import start_service

MAX_NEW = 8
PROMPTS = ["The weather today", "Once upon a time there"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("choices") / "llama", num_key_value_heads=2)


@pytest.fixture(scope="module")
def service(model_dir):
    return start_service(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def greedy(model, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=MAX_NEW,
            min_new_tokens=MAX_NEW,  # as the server with ignore_eos
            do_sample=False,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    ids = out.sequences[0, len(prompt_ids) :].tolist()
    # min_new_tokens masks EOS in the scores: the logprobs come from the raw logits instead
    with torch.no_grad():
        logits = model(out.sequences).logits[0, len(prompt_ids) - 1 : -1]
    logprobs = torch.log_softmax(logits, -1)
    return ids, [logprobs[i, t].item() for i, t in enumerate(ids)]


def sse_events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def serve(model_dir, service, calls, **args):
    """Runs `calls(post)` against a real router over the real shard; returns its result."""

    async def run():
        async with real_router_env(service, model_dir, **args) as env:

            async def post(route: str, body: dict, stream: bool = False):
                r = await env.client.post(route, json={"model": str(model_dir), **body})
                assert r.status == 200, await r.text()
                return await (r.text() if stream else r.json())

            return await calls(post)

    return asyncio.run(run())


def test_n_choices_of_several_prompts_text_and_token_ids_equal_transformers(
    model_dir, service, reference
):
    model, tokenizer = reference
    ids_b = tokenizer(PROMPTS[1])["input_ids"]
    body = {
        "prompt": [PROMPTS[0], ids_b],  # one as text, one as the token ids a client made
        "n": 2,
        "temperature": 0,
        "max_tokens": MAX_NEW,
        "ignore_eos": True,
        "logprobs": 1,
    }

    async def calls(post):
        return await post("/v1/completions", body)

    answer = serve(model_dir, service, calls)
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    prompt_ids = [tokenizer(PROMPTS[0])["input_ids"], ids_b]
    for i, choice in enumerate(choices):
        ref_ids, ref_logprobs = greedy(model, prompt_ids[i // 2])  # prompt-major, n per prompt
        assert choice["text"] == tokenizer.decode(ref_ids, skip_special_tokens=True)
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(ref_logprobs, abs=1e-4)
        assert choice["finish_reason"] == "length"
    usage = answer["usage"]
    # each prompt counted once, every choice's tokens
    assert usage["prompt_tokens"] == sum(len(p) for p in prompt_ids)
    assert usage["completion_tokens"] == 4 * MAX_NEW


def test_sampled_choices_are_the_request_alone_with_seed_plus_index(model_dir, service):
    body = {"prompt": PROMPTS[0], "temperature": 1.0, "max_tokens": MAX_NEW, "ignore_eos": True}
    chat_body = {
        "messages": [{"role": "user", "content": "Tell me"}],
        "temperature": 1.0,
        "max_tokens": MAX_NEW,
        "ignore_eos": True,
        "logprobs": True,
    }

    async def calls(post):
        together = await post("/v1/completions", {**body, "n": 3, "seed": 11, "logprobs": 0})
        alone = [
            await post("/v1/completions", {**body, "seed": 11 + i, "logprobs": 0}) for i in range(3)
        ]
        chat = await post("/v1/chat/completions", {**chat_body, "n": 2, "seed": 5})
        chat_alone = [
            await post("/v1/chat/completions", {**chat_body, "seed": 5 + i}) for i in range(2)
        ]
        return together, alone, chat, chat_alone

    together, alone, chat, chat_alone = serve(model_dir, service, calls)
    texts = [c["text"] for c in together["choices"]]
    assert texts == [a["choices"][0]["text"] for a in alone]
    assert len(set(texts)) > 1  # different samples, not one copied
    for choice, single in zip(together["choices"], alone, strict=True):
        assert choice["logprobs"] == single["choices"][0]["logprobs"]
    assert [c["message"] for c in chat["choices"]] == [
        a["choices"][0]["message"] for a in chat_alone
    ]
    assert [c["index"] for c in chat["choices"]] == [0, 1]
    assert chat["usage"]["prompt_tokens"] == chat_alone[0]["usage"]["prompt_tokens"]
    assert chat["usage"]["completion_tokens"] == 2 * MAX_NEW


def test_best_of_answers_the_most_likely_candidates(model_dir, service):
    body = {"prompt": PROMPTS[1], "temperature": 1.0, "max_tokens": MAX_NEW, "logprobs": 0}

    async def calls(post):
        best = await post("/v1/completions", {**body, "best_of": 4, "n": 2, "seed": 3})
        alone = [await post("/v1/completions", {**body, "seed": 3 + i}) for i in range(4)]
        return best, alone

    best, alone = serve(model_dir, service, calls, max_best_of=4)
    candidates = [a["choices"][0] for a in alone]
    ranked = sorted(candidates, key=lambda c: sum(c["logprobs"]["token_logprobs"]), reverse=True)
    assert [c["text"] for c in best["choices"]] == [c["text"] for c in ranked[:2]]
    assert [c["index"] for c in best["choices"]] == [0, 1]


def test_echo_returns_the_prompt_and_its_logprobs_as_transformers_computes_them(
    model_dir, service, reference
):
    """lm-eval's loglikelihood request: echo, logprobs 2, one new token, greedy."""
    model, tokenizer = reference
    body = {"prompt": PROMPTS[0], "echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0}

    async def calls(post):
        whole = await post("/v1/completions", body)
        streamed = await post("/v1/completions", {**body, "stream": True}, stream=True)
        return whole, streamed

    whole, streamed = serve(model_dir, service, calls)
    ids = tokenizer(PROMPTS[0])["input_ids"]
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
    choice = whole["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 1  # the prompt, then the new token
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for p in range(1, len(ids)):  # position p - 1 predicts prompt token p
        assert lp["token_logprobs"][p] == pytest.approx(logprobs[p - 1, ids[p]].item(), abs=1e-4)
        top = logprobs[p - 1].topk(2)
        pairs = zip(top.indices.tolist(), top.values.tolist(), strict=True)
        want = {tokenizer.decode([t]): v for t, v in pairs}
        got = lp["top_logprobs"][p]
        assert got.keys() == want.keys()
        assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-4)
    new_id = int(logprobs[-1].argmax())
    assert lp["token_logprobs"][-1] == pytest.approx(logprobs[-1, new_id].item(), abs=1e-4)
    assert choice["text"] == PROMPTS[0] + tokenizer.decode([new_id])

    events = sse_events(streamed)
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert text == choice["text"]
    first = events[0]["choices"][0]
    assert first["text"].startswith(PROMPTS[0])
    assert first["logprobs"]["token_logprobs"][: len(ids)] == lp["token_logprobs"][: len(ids)]


def test_streamed_choices_interleave_by_index_and_equal_the_whole_answer(model_dir, service):
    chat = {
        "messages": [{"role": "user", "content": "Hello"}],
        "n": 3,
        "seed": 9,
        "max_tokens": MAX_NEW,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    completion = {"prompt": PROMPTS, "n": 2, "seed": 4, "max_tokens": MAX_NEW}

    async def calls(post):
        whole_chat = await post("/v1/chat/completions", chat | {"stream_options": None})
        streamed_chat = await post("/v1/chat/completions", chat | {"stream": True}, stream=True)
        whole = await post("/v1/completions", completion)
        streamed = await post("/v1/completions", completion | {"stream": True}, stream=True)
        return whole_chat, streamed_chat, whole, streamed

    whole_chat, streamed_chat, whole, streamed = serve(model_dir, service, calls)
    events = sse_events(streamed_chat)
    assert streamed_chat.rstrip().endswith("data: [DONE]")
    usage = events[-1]
    assert usage["choices"] == []
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    # (the second request of the same prompt reads it from the prefix cache: cached_tokens)
    assert [usage["usage"][k] for k in counts] == [whole_chat["usage"][k] for k in counts]
    for choice in whole_chat["choices"]:
        mine = [e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == choice["index"]]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content", "") for c in mine) == choice["message"]["content"]
        assert [c["finish_reason"] for c in mine][-1] == choice["finish_reason"]
        assert all(c["finish_reason"] is None for c in mine[:-1])

    events = sse_events(streamed)
    assert {e["choices"][0]["index"] for e in events} == {0, 1, 2, 3}
    for choice in whole["choices"]:
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == choice["index"]]
        assert "".join(c["text"] for c in mine) == choice["text"]
        assert mine[-1]["finish_reason"] == choice["finish_reason"]


def test_min_p_one_keeps_only_the_most_likely_token_in_every_choice(model_dir, service, reference):
    """vLLM's min_p through the router: at 1.0 only the argmax survives, so every sampled
    choice is transformers' greedy text."""
    model, tokenizer = reference
    body = {"prompt": PROMPTS[1], "n": 3, "temperature": 1.3, "min_p": 1.0, "seed": 2}
    body |= {"max_tokens": MAX_NEW, "ignore_eos": True}

    async def calls(post):
        return await post("/v1/completions", body)

    answer = serve(model_dir, service, calls)
    ref_ids, _ = greedy(model, tokenizer(PROMPTS[1])["input_ids"])
    want = tokenizer.decode(ref_ids, skip_special_tokens=True)
    assert [c["text"] for c in answer["choices"]] == [want] * 3


def test_echo_offsets_index_the_echoed_text_whole_and_streamed(model_dir, service):
    """Characters split over byte tokens, special tokens, `echo: null` (OpenAI's default)."""
    prompt = "Emoji: \U0001f680 na\u00efve \u2211 \u03c0 \u65e5\u672c"
    body = {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 4, "temperature": 0}

    async def calls(post):
        whole = await post("/v1/completions", body)
        streamed = await post("/v1/completions", {**body, "stream": True}, stream=True)
        plain = await post("/v1/completions", {**body, "echo": None})
        return whole, streamed, plain

    whole, streamed, plain = serve(model_dir, service, calls)
    choice = whole["choices"][0]
    text, offsets = choice["text"], choice["logprobs"]["text_offset"]
    assert text.startswith(prompt)
    assert offsets == sorted(offsets) and offsets[-1] <= len(text)
    generated = offsets[-4:]  # the new tokens start where the echoed prompt ends
    assert generated[0] == len(prompt)
    events = [e["choices"][0] for e in sse_events(streamed) if e["choices"]]
    assert "".join(e["text"] for e in events) == text
    streamed_offsets = [o for e in events if e["logprobs"] for o in e["logprobs"]["text_offset"]]
    assert streamed_offsets == offsets
    assert plain["choices"][0]["text"] == text[len(prompt) :]  # null: no echo
