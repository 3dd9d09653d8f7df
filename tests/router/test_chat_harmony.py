"""gpt-oss's harmony answers on /v1/chat/completions (`--reasoning-parser openai_gptoss`,
`--tool-call-parser openai`) against fake shards writing a scripted answer over the gpt_oss
family's tokenizer, whose markup tokens are special (the answer's text leaves them out): the
analysis channel goes to `reasoning_content`, the final one to `content`, calls to `tool_calls`,
whole and streamed; a grammar holds from the first token."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from launcher.chat_families import family_eos_ids, family_tokenizer, save_family
from router.limits import ConfigError
from tests.router.harness import async_test, router_env
from tests.router.test_chat_tools import (
    ALARM,
    FORECAST,
    FORECAST_PARAMETERS,
    WEATHER,
    joined_calls,
    stream_deltas,
)
from tests.router.test_chat_tools import post as post_80

ANSWER = (
    "<|channel|>analysis<|message|>User asks about Paris. Let's answer.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Paris is sunny.<|return|>"
)
CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>"
    "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
    '<|message|>{"city":"Paris","unit":"c"}<|call|>'
)
PARSERS = {"reasoning_parser": "openai_gptoss", "tool_call_parser": "openai"}
AUTO = {**PARSERS, "enable_auto_tool_choice": True}


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt_oss")
    save_family("gpt_oss", path)
    return path, family_tokenizer("gpt_oss")


async def post(env, stream: bool = False, **body: Any):
    """A chat request with room for the answers (the tiny vocabulary spells text out)."""
    return await post_80(env, stream, **{"max_tokens": 300, **body})


def walking(tok) -> dict[str, Any]:
    """Fake shards over the family's vocabulary ending at `<|return|>` or `<|call|>`."""
    return {"vocab_size": len(tok), "eos_token_ids": tuple(family_eos_ids("gpt_oss", tok)),
            "max_position_embeddings": 4096, "num_blocks": 4096}  # fmt: skip


def scripted(tok, text: str) -> dict[str, Any]:
    """Fake shards that answer `text` (its markup as the special tokens; it ends with one of
    the EOS tokens)."""
    return {**walking(tok), "script": tuple(tok.encode(text, add_special_tokens=False))}


def streamed(text: str) -> tuple[str, str, list[dict], str | None]:
    deltas, finishes = stream_deltas(text)
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    return reasoning, content, joined_calls(deltas), finishes[-1]


@async_test
async def test_analysis_goes_to_reasoning_and_final_to_content(gpt_oss):
    path, tok = gpt_oss
    async with router_env(path, 1, scripted(tok, ANSWER), **PARSERS) as env:
        status, text = await post(env)
        assert status == 200, text
        choice = json.loads(text)["choices"][0]
        assert choice["message"]["reasoning_content"] == "User asks about Paris. Let's answer."
        assert choice["message"]["content"] == "Paris is sunny."
        assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
        prompt = tok.decode(env.shards[0].prefilled[-1].input_ids)
        assert prompt.endswith("<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant")
        status, text = await post(env, stream=True)
        assert status == 200, text
        assert streamed(text) == (
            "User asks about Paris. Let's answer.", "Paris is sunny.", [], "stop")  # fmt: skip


@async_test
async def test_a_call_after_reasoning_and_a_preamble(gpt_oss):
    path, tok = gpt_oss
    async with router_env(path, 1, scripted(tok, CALL), **AUTO) as env:
        status, text = await post(env, tools=[WEATHER])
        assert status == 200, text
        choice = json.loads(text)["choices"][0]
        message = choice["message"]
        assert message["reasoning_content"] == "Need the weather."
        assert message["content"] == "Let me check."
        (call,) = message["tool_calls"]
        assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "c"}
        assert choice["finish_reason"] == "tool_calls"
        prompt = tok.decode(env.shards[0].prefilled[-1].input_ids)
        assert "namespace functions {" in prompt and "type get_weather = " in prompt
        status, text = await post(env, stream=True, tools=[WEATHER])
        assert status == 200, text
        reasoning, content, calls, finish = streamed(text)
        assert (reasoning, content, finish) == ("Need the weather.", "Let me check.", "tool_calls")
        assert [c["name"] for c in calls] == ["get_weather"]
        assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "unit": "c"}
    # Without --tool-call-parser the call stays visible, in the canonical form.
    only = {"reasoning_parser": "openai_gptoss"}
    async with router_env(path, 1, scripted(tok, CALL), **only) as env:
        status, text = await post(env)
        message = json.loads(text)["choices"][0]["message"]
        assert message["content"] == (
            "Let me check.<|channel|>commentary to=functions.get_weather<|message|>"
            '{"city":"Paris","unit":"c"}<|call|>'
        )


@async_test
async def test_history_with_a_call_and_its_result_reaches_the_template(gpt_oss):
    path, tok = gpt_oss
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    async with router_env(path, 1, scripted(tok, ANSWER), **AUTO) as env:
        status, text = await post(env, messages=history, tools=[WEATHER])
        assert status == 200, text
        prompt = tok.decode(env.shards[0].prefilled[-1].input_ids)
        assert "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools" in prompt
        assert prompt.endswith(
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
            '{"city": "Paris"}<|call|><|start|>functions.get_weather to=assistant<|channel|>'
            "commentary<|message|>sunny<|end|><|start|>assistant"
        )


@async_test
async def test_a_grammar_holds_from_the_first_token(gpt_oss):
    """The script would reason first; under a grammar the answer has no reasoning: the fake
    shard writes what the grammar allows from its first token on."""
    path, tok = gpt_oss
    schema = {"type": "json_schema", "json_schema": {"name": "f", "schema": FORECAST_PARAMETERS}}
    async with router_env(path, 1, scripted(tok, ANSWER), **PARSERS) as env:
        status, text = await post(env, response_format=schema)
        assert status == 200, text
        message = json.loads(text)["choices"][0]["message"]
        assert message["reasoning_content"] is None, message
        jsonschema.validate(json.loads(message["content"]), FORECAST_PARAMETERS)
        assert env.violations() == []
    async with router_env(path, 1, walking(tok), **PARSERS) as env:
        tools = {"tools": [FORECAST, ALARM], "tool_choice": "required"}
        for stream in (False, True):
            status, text = await post(env, stream=stream, parallel_tool_calls=False, **tools)
            assert status == 200, text
            if stream:
                reasoning, content, calls, finish = streamed(text)
                parts = [p for d in stream_deltas(text)[0] for p in d.get("tool_calls") or []]
                assert len(parts) > 2  # the enforced call's arguments stream as written
            else:
                choice = json.loads(text)["choices"][0]
                message, finish = choice["message"], choice["finish_reason"]
                reasoning, content = message["reasoning_content"], message["content"]
                calls = [c["function"] for c in message["tool_calls"]]
            assert not reasoning and not content and finish == "tool_calls"
            (call,) = calls
            schemas = {
                "forecast": FORECAST_PARAMETERS,
                "set_alarm": ALARM["function"]["parameters"],
            }
            jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])
        assert env.violations() == []


@async_test
async def test_a_tokenizer_without_harmony_tokens_is_refused_at_startup(model_dir):
    with pytest.raises(ConfigError, match="--reasoning-parser openai_gptoss.*<\\|channel\\|>"):
        async with router_env(model_dir, 1, reasoning_parser="openai_gptoss"):
            pass
