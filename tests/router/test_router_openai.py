"""OpenAI's /v1/completions, /v1/chat/completions and /v1/models against deterministic fake shards.

The fake shards answer next token = last token + 1: a prompt "H" continues "IJKLM...", and "<s>"
(token 1) is followed by token 2, the EOS token.
"""

import pytest

from router.handlers.openai_common import StopTrimmer
from tests.router.harness import async_test, parse_sse, router_env

HI = [{"role": "user", "content": "Hi"}]


def expected_chat(env, n: int) -> tuple[list[int], str]:
    """The fake shards' continuation of the chat-templated prompt, and its text."""
    tok = env.infer.tokenizer.decoder
    prompt = tok.apply_chat_template(HI, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(prompt, add_special_tokens=False)
    new = [(ids[-1] + 1 + i) % 512 for i in range(n)]
    return ids, tok.decode(new, skip_special_tokens=True)


def sse_chunks(text: str) -> tuple[list[dict], list[str]]:
    raw = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    return parse_sse(text.replace("data: [DONE]", "")), raw


@async_test
async def test_chat_completion_and_sampling_mapping(model_dir):
    async with router_env(model_dir) as env:
        body = {"model": str(model_dir), "messages": HI, "max_tokens": 5, "temperature": 0}
        r = await env.client.post("/v1/chat/completions", json=body)
        assert r.status == 200, await r.text()
        out = await r.json()
        prompt_ids, text = expected_chat(env, 5)
        assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
        assert out["model"] == str(model_dir)
        choice = out["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": text}
        assert choice["finish_reason"] == "length" and choice["logprobs"] is None
        assert out["usage"] == {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": 5,
            "total_tokens": len(prompt_ids) + 5,
            "prompt_tokens_details": {"cached_tokens": 0},  # the first request: nothing cached
        }
        assert r.headers["x-prompt-tokens"] == str(len(prompt_ids))
        assert r.headers["x-generated-tokens"] == "5" and "x-queue-time" in r.headers
        sent = env.shards[0].prefilled[-1]
        assert list(sent.input_ids) == prompt_ids  # the template's text, no extra BOS
        assert not sent.parameters.do_sample  # temperature 0 = greedy

        # OpenAI samples by default; top_p 1.0 is "off" (TGI itself refuses 1.0).
        for extra, sample, temperature, top_p in [
            ({}, True, 1.0, 1.0),
            ({"temperature": 0.5, "top_p": 1.0}, True, 0.5, 1.0),
            ({"top_p": 0.9, "seed": 7}, True, 1.0, pytest.approx(0.9)),
            ({"temperature": 0, "top_p": 0.5, "top_k": 3}, False, 1.0, 1.0),
        ]:
            r = await env.client.post(
                "/v1/chat/completions", json={"messages": HI, "max_tokens": 2, **extra}
            )
            assert r.status == 200, await r.text()
            p = env.shards[0].prefilled[-1].parameters
            assert (p.do_sample, p.temperature, p.top_p) == (sample, temperature, top_p)
        assert env.shards[0].prefilled[-2].parameters.seed == 7
        # OpenAI's penalties reach the shards as given (greedy rows are penalized too).
        body = {"messages": HI, "max_tokens": 1, "temperature": 0}
        penalties = {"frequency_penalty": 0.5, "presence_penalty": -1.5}
        r = await env.client.post("/v1/chat/completions", json={**body, **penalties})
        assert r.status == 200, await r.text()
        p = env.shards[0].prefilled[-1].parameters
        assert (p.frequency_penalty, p.presence_penalty) == (0.5, -1.5)
        # logit_bias reaches them as token id -> bias, on both routes; "07" is token 7.
        bias = {"logit_bias": {"5": -100, "07": 2.5, "300": 100}}
        for path, first in [("/v1/chat/completions", {"messages": HI}), ("/v1/completions", {
                "prompt": "hi"})]:  # fmt: skip
            r = await env.client.post(path, json={**first, "max_tokens": 1, **bias})
            assert r.status == 200, await r.text()
            sent = env.shards[0].prefilled[-1].parameters.logit_bias
            assert dict(sent) == {5: -100.0, 7: 2.5, 300: 100.0}
        # vLLM's top_k: -1 (its old default, which clients send) and 0 mean every token.
        for path, body in [
            ("/v1/chat/completions", {"messages": HI}),
            ("/v1/completions", {"prompt": "hi"}),
        ]:
            for top_k, sent in [(-1, 0), (0, 0), (5, 5)]:
                r = await env.client.post(path, json={**body, "max_tokens": 1, "top_k": top_k})
                assert r.status == 200, await r.text()
                assert env.shards[0].prefilled[-1].parameters.top_k == sent
            r = await env.client.post(path, json={**body, "top_k": -2})
            assert r.status == 422
            assert (await r.json())["error"] == (
                "Input validation error: `top_k` must be -1 or 0 (every token), or positive"
            )
        # max_completion_tokens wins over the deprecated max_tokens.
        body = {"messages": HI, "max_tokens": 9, "max_completion_tokens": 3}
        r = await env.client.post("/v1/chat/completions", json=body)
        assert (await r.json())["usage"]["completion_tokens"] == 3
        assert env.violations() == []


@async_test
async def test_chat_stream_usage_and_logprobs(model_dir):
    async with router_env(model_dir) as env:
        body = {
            "messages": HI,
            "max_tokens": 6,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
            "top_logprobs": 2,
        }
        r = await env.client.post("/v1/chat/completions", json=body)
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        chunks, raw = sse_chunks(await r.text())
        assert raw[-1] == "[DONE]"
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert len({c["id"] for c in chunks}) == 1
        deltas = [c["choices"][0] for c in chunks[1:-2]]
        _, text = expected_chat(env, 6)
        assert "".join(d["delta"]["content"] for d in deltas) == text
        assert all(len(d["logprobs"]["content"][0]["top_logprobs"]) == 2 for d in deltas)
        assert all(isinstance(d["logprobs"]["content"][0]["logprob"], float) for d in deltas)
        assert chunks[-2]["choices"][0] == {
            "index": 0,
            "delta": {},
            "logprobs": None,
            "finish_reason": "length",
        }
        assert all(c["usage"] is None for c in chunks[:-1])
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6

        # Without stream_options there is no usage key at all, and no usage chunk.
        body = {"messages": HI, "max_tokens": 2, "stream": True}
        chunks, raw = sse_chunks(
            await (await env.client.post("/v1/chat/completions", json=body)).text()
        )
        assert all("usage" not in c for c in chunks) and chunks[-1]["choices"][0]["finish_reason"]
        assert env.violations() == []


@async_test
async def test_completions_trim_the_stop_sequence_streamed_or_not(model_dir):
    async with router_env(model_dir) as env:
        body = {"model": str(model_dir), "prompt": "H", "max_tokens": 9, "stop": ["LM", "zz"]}
        r = await env.client.post("/v1/completions", json=body)
        out = await r.json()
        assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
        # OpenAI leaves the stop sequence out (TGI's /generate keeps it).
        assert out["choices"][0]["text"] == "IJK"
        assert out["choices"][0]["finish_reason"] == "stop"
        assert out["usage"]["completion_tokens"] == 5
        r = await env.client.post("/v1/completions", json={**body, "stream": True, "stop": "LM"})
        chunks, raw = sse_chunks(await r.text())
        assert raw[-1] == "[DONE]"
        assert [c["choices"][0]["text"] for c in chunks] == ["I", "J", "K", ""]  # L held back
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        # A list of one prompt is one prompt.
        r = await env.client.post("/v1/completions", json={"prompt": ["H"], "max_tokens": 2})
        assert (await r.json())["choices"][0]["text"] == "IJ"


@async_test
async def test_completions_defaults_ignore_eos_and_logprobs(model_dir):
    async with router_env(model_dir) as env:
        r = await env.client.post("/v1/completions", json={"prompt": "H"})
        out = await r.json()
        assert out["usage"]["completion_tokens"] == 16  # OpenAI's default max_tokens
        # "<s>" is followed by EOS: the completion stops, unless ignore_eos (vLLM's extension).
        r = await env.client.post("/v1/completions", json={"prompt": "<s>", "max_tokens": 5})
        out = await r.json()
        assert out["choices"][0] == {
            "index": 0, "text": "", "logprobs": None, "finish_reason": "stop"
        }  # fmt: skip
        assert not env.shards[0].prefilled[-1].stopping_parameters.ignore_eos_token
        body = {"prompt": "<s>", "max_tokens": 5, "ignore_eos": True, "logprobs": 2}
        out = await (await env.client.post("/v1/completions", json=body)).json()
        assert out["choices"][0]["finish_reason"] == "length"
        assert out["usage"]["completion_tokens"] == 5
        assert env.shards[0].prefilled[-1].stopping_parameters.ignore_eos_token
        lp = out["choices"][0]["logprobs"]
        assert lp["tokens"][0] == "</s>" and len(lp["token_logprobs"]) == 5
        assert all(len(alternatives) == 2 for alternatives in lp["top_logprobs"])
        assert lp["text_offset"][0] == 0
        assert env.violations() == []


@async_test
async def test_models_and_chat_without_template(model_dir, tokenizer, tmp_path):
    async with router_env(model_dir, served_model_name="tiny") as env:
        r = await env.client.get("/v1/models")
        models = await r.json()
        assert models["object"] == "list"
        assert [(m["id"], m["object"]) for m in models["data"]] == [("tiny", "model")]
    plain = tmp_path / "no-template"
    tokenizer.save_pretrained(plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    import json

    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    async with router_env(plain) as env:
        r = await env.client.post("/v1/chat/completions", json={"messages": HI})
        assert r.status == 422
        assert "no chat template" in (await r.json())["error"]


@pytest.mark.parametrize(
    "chunks,stops,expected",
    [
        (["ab", "c"], ["x"], ["ab", "c"]),
        (["I", "J", "K", "L", "M", "N"], ["LM"], ["I", "J", "K", "", ""]),
        (["a", "bST", "OPc"], ["STOP"], ["a", "b", ""]),
        (["a", "S", "x"], ["ST"], ["a", "", "Sx"]),  # a partial match that fails is released
        (["xx<e", "nd>yy"], ["<end>", "nd"], ["xx", ""]),  # the earliest match wins
    ],
)
def test_stop_trimmer(chunks, stops, expected):
    trimmer = StopTrimmer(stops)
    out = [trimmer.push(c) for c in chunks]
    out[-1] += trimmer.flush()
    assert out[: len(expected)] == expected


@async_test
async def test_chat_template_kwargs_reach_the_template(tokenizer, tmp_path):
    """vLLM's chat_template_kwargs: extra template variables (Qwen3's enable_thinking)."""
    path = tmp_path / "thinking-template"
    tokenizer.save_pretrained(path)  # the shared fixture itself stays as it is
    (path / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}/no_think\n{% endif %}"
        "assistant:"
    )
    async with router_env(path) as env:

        async def sent_prompt(**extra) -> str:
            body = {"messages": HI, "max_tokens": 1, **extra}
            r = await env.client.post("/v1/chat/completions", json=body)
            assert r.status == 200, await r.text()
            return tokenizer.decode(env.shards[0].prefilled[-1].input_ids)

        assert "/no_think" not in await sent_prompt()
        assert "/no_think" in await sent_prompt(chat_template_kwargs={"enable_thinking": False})
        assert "/no_think" not in await sent_prompt(chat_template_kwargs={"enable_thinking": True})
        for bad, message in [
            ("yes", "`chat_template_kwargs` must be a JSON object"),
            ({"tokenize": True, "messages": []}, "may not set `messages`, `tokenize`"),
        ]:
            body = {"messages": HI, "chat_template_kwargs": bad}
            r = await env.client.post("/v1/chat/completions", json=body)
            assert r.status == 422 and message in (await r.json())["error"]
