"""The stream adds up to the text, on every route, whatever tokens the model emits.

The fake shards generate a fixed script of ids here, so that a special token can land between
the bytes of one character, an EOS token right after half a character, and a stop sequence or
the EOS token on the last allowed token.
"""

import pytest

from tests.router.harness import async_test, parse_sse, router_env

EOS, END = 2, 3  # the fake shards' EOS token (</s>), and <|end|>: special, not EOS


@pytest.fixture(scope="module")
def pieces(tokenizer):
    """Ids of "Hi", of one character that takes several byte tokens, and of " brown"."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    char = next(ids for ids in map(encode, "日本語🚀🔥") if len(ids) > 1)
    return encode("Hi"), char, encode(" brown")


async def _texts(env, max_tokens: int, stop: list[str] | None = None) -> dict[str, object]:
    """What each route answers for the prompt "H": texts, the streams' joined deltas, and the
    finish reasons."""
    out: dict[str, object] = {}
    tgi = {"max_new_tokens": max_tokens, "details": True, "stop": stop or []}
    r = await env.client.post("/generate", json={"inputs": "H", "parameters": tgi})
    body = await r.json()
    out["generate"] = body["generated_text"]
    out["generate_reason"] = body["details"]["finish_reason"]
    r = await env.client.post("/generate_stream", json={"inputs": "H", "parameters": tgi})
    events = parse_sse(await r.text())
    out["generate_stream"] = "".join(
        e["token"]["text"] for e in events if not e["token"]["special"]
    )
    out["generate_stream_all"] = "".join(e["token"]["text"] for e in events)
    out["generate_stream_final"] = events[-1]["generated_text"]
    for path, body in [
        ("/v1/completions", {"prompt": "H"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "H"}]}),
    ]:
        body = {**body, "max_tokens": max_tokens, "temperature": 0, "stop": stop}
        choice = (await (await env.client.post(path, json=body)).json())["choices"][0]
        out[path] = choice["text"] if "text" in choice else choice["message"]["content"]
        out[f"{path} reason"] = choice["finish_reason"]
        r = await env.client.post(path, json={**body, "stream": True})
        raw = (await r.text()).replace("data: [DONE]", "")
        chunks = [c["choices"][0] for c in parse_sse(raw) if c["choices"]]
        out[f"{path} stream"] = "".join(
            c.get("text") or c.get("delta", {}).get("content") or "" for c in chunks
        )
        out[f"{path} stream reason"] = chunks[-1]["finish_reason"]
    return out


def _agree(out: dict[str, object], text: str) -> None:
    assert out["generate"] == out["generate_stream"] == out["generate_stream_final"] == text, out
    for path in ("/v1/completions", "/v1/chat/completions"):
        assert out[path] == out[f"{path} stream"] == text, (path, out)


@async_test
async def test_a_special_token_between_the_bytes_of_a_character(model_dir, tokenizer, pieces):
    hi, char, brown = pieces
    script = (*hi, *char[:1], END, *char[1:], *brown, EOS)
    async with router_env(model_dir, shard={"script": script}) as env:
        out = await _texts(env, max_tokens=len(script) + 4)
        text = tokenizer.decode(list(script), skip_special_tokens=True)
        assert "\ufffd" not in text  # the character is whole once <|end|> is skipped
        _agree(out, text)
        assert env.violations() == []


@async_test
async def test_eos_right_after_half_a_character(model_dir, tokenizer, pieces):
    hi, char, _ = pieces
    script = (*hi, *char[:-1], EOS)
    async with router_env(model_dir, shard={"script": script}) as env:
        out = await _texts(env, max_tokens=len(script) + 4)
        text = tokenizer.decode(list(script), skip_special_tokens=True)
        assert text.endswith("\ufffd")  # what the final decode gives for the half character
        for path in ("/v1/completions", "/v1/chat/completions"):
            assert out[path] == out[f"{path} stream"] == text, (path, out)
        assert out["generate"] == out["generate_stream_final"] == text
        # TGI's stream: the held-back bytes come out with the last token, here the special
        # EOS token, before its own text.
        assert out["generate_stream_all"] == text + "</s>"


@async_test
async def test_stop_or_eos_on_the_last_allowed_token_is_stop_on_openai_routes(
    model_dir, tokenizer, pieces
):
    """TGI reports "length" there (its order: the limit first); OpenAI's routes report "stop",
    as vLLM does, since their text is cut at the stop sequence."""
    hi, _, brown = pieces
    script = (*hi, *brown, EOS)
    async with router_env(model_dir, shard={"script": script}) as env:
        openai = ("/v1/completions", "/v1/chat/completions")
        # The stop sequence completes on the last allowed token, then one token earlier.
        for max_tokens, reason in [
            (len(hi) + len(brown), "length"),
            (len(script), "stop_sequence"),
        ]:
            out = await _texts(env, max_tokens=max_tokens, stop=[" brown"])
            assert out["generate_reason"] == reason
            for path in openai:
                assert out[path] == out[f"{path} stream"] == "Hi", (path, out)
                assert out[f"{path} reason"] == out[f"{path} stream reason"] == "stop"
        # EOS on the last allowed token.
        out = await _texts(env, max_tokens=len(script))
        assert out["generate_reason"] == "length"
        assert [out[f"{p} reason"] for p in openai] == ["stop", "stop"]
        # The limit alone: "length" everywhere.
        out = await _texts(env, max_tokens=len(hi))
        assert out["generate_reason"] == "length"
        assert [out[f"{p} reason"] for p in openai] == ["length", "length"]
        assert [out[f"{p} stream reason"] for p in openai] == ["length", "length"]
