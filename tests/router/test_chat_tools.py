"""Tool calling on /v1/chat/completions against fake shards that write a scripted answer (or,
under an enforced tool_choice, the first tokens the grammar allows): the template renders the
tools, the answer's calls come back as OpenAI's `tool_calls`, whole and streamed, and the
refusals name what to change."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from launcher.chat_families import family_tokenizer, save_family
from tests.router.harness import async_test, parse_sse, router_env

CHAT = "/v1/chat/completions"
ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
# No free text in its arguments: the fake shard's walk through the grammar always ends.
FORECAST_PARAMETERS = {
    "type": "object",
    "properties": {
        "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "hourly": {"type": "boolean"},
    },
    "required": ["unit", "days"],
    "additionalProperties": False,
}
FORECAST = {
    "type": "function",
    "function": {"name": "forecast", "parameters": FORECAST_PARAMETERS},
}
ALARM = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "parameters": {
            "type": "object",
            "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
            "required": ["hour"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen")
    save_family("qwen", path)
    return path, family_tokenizer("qwen")


def walking(tok) -> dict[str, Any]:
    """Fake shards over the family's vocabulary that take, each step, the first token the
    step's mask allows from the last one on (prompts with tools are long: room for them)."""
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    return {"vocab_size": len(tok), "eos_token_ids": (eos,), "max_position_embeddings": 4096,
            "num_blocks": 4096}  # fmt: skip


def scripted(tok, text: str) -> dict[str, Any]:
    """Fake shards that answer `text` then the family's EOS token."""
    ids = tok.encode(text, add_special_tokens=False) + list(walking(tok)["eos_token_ids"])
    return {**walking(tok), "script": tuple(ids)}


HERMES = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
    "</tool_call>"
)


async def post(env, stream: bool = False, **body: Any):
    r = await env.client.post(CHAT, json={"messages": ASK, "max_tokens": 80, **body,
                                          "stream": stream})  # fmt: skip
    return r.status, (await r.text())


def stream_deltas(text: str) -> tuple[list[dict], list[str | None]]:
    events = parse_sse(text.replace("data: [DONE]", ""))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"]]
    return deltas, finishes


def joined_calls(deltas: list[dict]) -> list[dict]:
    """Streamed tool_calls deltas put together as a client does (by index)."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        for part in delta.get("tool_calls") or []:
            call = calls.setdefault(part["index"], {"id": None, "name": None, "arguments": ""})
            call["id"] = part.get("id") or call["id"]
            function = part.get("function") or {}
            call["name"] = function.get("name") or call["name"]
            call["arguments"] += function.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


@async_test
async def test_auto_finds_calls_whole_and_streamed(qwen):
    path, tok = qwen
    async with router_env(path, 1, scripted(tok, "Let me look." + CALL), **HERMES) as env:
        status, text = await post(env, tools=[WEATHER])
        assert status == 200, text
        choice = json.loads(text)["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        message = choice["message"]
        assert message["content"] == "Let me look."
        (call,) = message["tool_calls"]
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "c"}
        # The template showed the model the tool, as Qwen's does.
        prompt = tok.decode(env.shards[0].prefilled[-1].input_ids)
        assert "<tools>" in prompt and '"name": "get_weather"' in prompt

        status, text = await post(env, stream=True, tools=[WEATHER])
        assert status == 200, text
        deltas, finishes = stream_deltas(text)
        content = "".join(d.get("content") or "" for d in deltas)
        assert content == "Let me look."  # no markup leaks
        (streamed,) = joined_calls(deltas)
        assert streamed["name"] == "get_weather" and streamed["id"].startswith("call_")
        # Under auto a call is told once complete and checked: its name, then its arguments.
        assert len([p for d in deltas for p in d.get("tool_calls") or []]) == 2
        assert json.loads(streamed["arguments"]) == {"city": "Paris", "unit": "c"}
        assert finishes[-1] == "tool_calls"
        assert env.violations() == []


@async_test
async def test_several_calls_in_one_answer(qwen):
    path, tok = qwen
    second = CALL.replace("Paris", "Oslo")
    async with router_env(path, 1, scripted(tok, CALL + "\n" + second), **HERMES) as env:
        for stream in (False, True):
            status, text = await post(env, stream=stream, tools=[WEATHER], max_tokens=200)
            assert status == 200, text
            if stream:
                deltas, _ = stream_deltas(text)
                calls = joined_calls(deltas)
            else:
                message = json.loads(text)["choices"][0]["message"]
                assert message["content"] is None
                calls = [dict(c["function"], id=c["id"]) for c in message["tool_calls"]]
            assert [json.loads(c["arguments"])["city"] for c in calls] == ["Paris", "Oslo"]
            assert len({c["id"] for c in calls}) == 2


@async_test
async def test_an_answer_without_calls_and_a_malformed_call_are_text(qwen):
    path, tok = qwen
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    for answer in ["It is sunny in Paris.", broken]:
        async with router_env(path, 1, scripted(tok, answer), **HERMES) as env:
            for stream in (False, True):
                status, text = await post(env, stream=stream, tools=[WEATHER])
                assert status == 200, text
                if stream:
                    deltas, finishes = stream_deltas(text)
                    assert "".join(d.get("content") or "" for d in deltas) == answer
                    assert joined_calls(deltas) == [] and finishes[-1] == "stop"
                else:
                    choice = json.loads(text)["choices"][0]
                    assert choice["message"]["content"] == answer
                    assert "tool_calls" not in choice["message"]
                    assert choice["finish_reason"] == "stop"


@async_test
async def test_required_and_named_choices_are_enforced_by_a_grammar(qwen):
    """The fake shard writes whatever the grammar allows first: the answer is still calls
    that parse, name an offered tool and follow its schema."""
    path, tok = qwen
    schemas = {"forecast": FORECAST_PARAMETERS, "set_alarm": ALARM["function"]["parameters"]}
    async with router_env(path, 1, walking(tok), tool_call_parser="hermes") as env:
        for choice, parallel, names in [
            ("required", False, None),
            ({"type": "function", "function": {"name": "set_alarm"}}, True, ["set_alarm"]),
        ]:
            for stream in (False, True):
                status, text = await post(
                    env, stream=stream, tools=[FORECAST, ALARM], tool_choice=choice,
                    parallel_tool_calls=parallel,
                )  # fmt: skip
                assert status == 200, text
                if stream:
                    deltas, finishes = stream_deltas(text)
                    calls = joined_calls(deltas)
                    # Enforced calls cannot be malformed: arguments stream as they are written.
                    parts = [p for d in deltas for p in d.get("tool_calls") or []]
                    assert len(parts) > 3 and "name" in parts[0]["function"]
                    assert not "".join(d.get("content") or "" for d in deltas).strip()
                    assert finishes[-1] == "tool_calls"
                else:
                    out = json.loads(text)["choices"][0]
                    assert out["finish_reason"] == "tool_calls", out
                    assert out["message"]["content"] is None
                    calls = [dict(c["function"], id=c["id"]) for c in out["message"]["tool_calls"]]
                assert len(calls) == 1  # one call: parallel_tool_calls false, or a named one
                for call in calls:
                    assert names is None or call["name"] in names
                    jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])
        assert env.violations() == []


@async_test
async def test_history_with_calls_and_results_reaches_the_template(qwen):
    path, tok = qwen
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
    ]  # fmt: skip
    async with router_env(path, 1, scripted(tok, "Sunny, 22 C."), **HERMES) as env:
        status, text = await post(env, messages=history, tools=[WEATHER])
        assert status == 200, text
        assert json.loads(text)["choices"][0]["message"]["content"] == "Sunny, 22 C."
        prompt = tok.decode(env.shards[0].prefilled[-1].input_ids)
        assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
        assert "<tool_response>\n22 C, sunny\n</tool_response>" in prompt


@async_test
async def test_refusals_name_what_to_change(qwen, model_dir):
    path, tok = qwen
    named = {"type": "function", "function": {"name": "nope"}}
    bad_history = [*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{city"}}]}]  # fmt: skip
    cases = [
        ({}, {"tools": [WEATHER]}, "--enable-auto-tool-choice"),
        ({}, {"tools": [WEATHER], "tool_choice": "required"}, "--tool-call-parser"),
        ({"tool_call_parser": "hermes"}, {"tools": [WEATHER]}, "--enable-auto-tool-choice"),
        (HERMES, {"tool_choice": "required"}, "needs `tools`"),
        (HERMES, {"tools": [WEATHER], "tool_choice": named}, "is not one of `tools`"),
        (HERMES, {"tools": [WEATHER, WEATHER]}, "twice"),
        (HERMES, {"tools": [WEATHER], "tool_choice": "required",
                  "response_format": {"type": "json_object"}}, "response_format"),
        (HERMES, {"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0]"),
        (HERMES, {"messages": bad_history}, "messages[1].tool_calls[0].function.arguments"),
        (HERMES, {"functions": [{"name": "f"}]}, "`tools`"),
    ]  # fmt: skip
    async with router_env(path, 1, walking(tok), **HERMES) as env:
        for flags, body, says in cases:
            if flags != HERMES:
                continue
            status, text = await post(env, **body)
            assert status == 422 and says in text, (body, text)
    for flags, body, says in cases:
        if flags == HERMES:
            continue
        async with router_env(path, 1, walking(tok), **flags) as env:
            status, text = await post(env, **body)
            assert status == 422 and says in text, (flags, body, text)
    # A template that never reads `tools` would drop them: refused, not rendered without them.
    async with router_env(model_dir, 1, **HERMES) as env:
        status, text = await post(env, tools=[WEATHER])
        assert status == 422 and "does not render tools" in text, text
        status, text = await post(env, tools=[WEATHER], tool_choice="none")
        assert status == 422 and "does not render tools" in text, text
        history = [*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                   "function": {"name": "f", "arguments": "{}"}}]}]  # fmt: skip
        status, text = await post(env, messages=history)
        assert status == 422 and "does not render an assistant's `tool_calls`" in text, text


ARGUMENTS = {"city": "Paris", "unit": "c"}
FAMILY_CALLS = [
    ("qwen", "hermes", "Let me look." + CALL, "Let me look."),
    ("llama3", "llama3_json",
     '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}', None),
    ("mistral", "mistral",
     'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]',
     "Sure."),
    ("llama4", "pythonic", '[get_weather(city="Paris", unit="c")]', None),
    ("qwen3_coder", "qwen3_coder", "Let me look.\n<tool_call>\n<function=get_weather>\n"
     "<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n"
     "</tool_call>", "Let me look."),
    ("kimi_k2", "kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
     '<|tool_call_argument_begin|>{"city": "Paris", "unit": "c"}<|tool_call_end|>'
     "<|tool_calls_section_end|>", None),
]  # fmt: skip


@pytest.mark.parametrize("family,parser,answer,content", FAMILY_CALLS)
@async_test
async def test_each_format_whole_streamed_and_enforced(family, parser, answer, content, tmp_path):
    """Every parser over its family's template and tokenizer (the markers of Mistral and Llama 3
    are special tokens, which the answer's text leaves out: the parsers still see them)."""
    save_family(family, tmp_path)
    tok = family_tokenizer(family)
    # Llama's templates write the tools as indented JSON: long prompts in a tiny vocabulary.
    flags = {"tool_call_parser": parser, "enable_auto_tool_choice": True, "max_input_tokens": 3000}
    async with router_env(tmp_path, 1, scripted(tok, answer), **flags) as env:
        status, text = await post(env, tools=[WEATHER], max_tokens=300)
        assert status == 200, text
        message = json.loads(text)["choices"][0]["message"]
        assert message["content"] == content
        (call,) = message["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == ARGUMENTS
        if parser == "mistral":  # Mistral's templates take nine letters and digits
            assert len(call["id"]) == 9 and call["id"].isalnum()
        if parser == "kimi_k2":  # the id the model wrote, which Kimi's template reads back
            assert call["id"] == "functions.get_weather:0"
        status, text = await post(env, stream=True, tools=[WEATHER], max_tokens=300)
        deltas, finishes = stream_deltas(text)
        assert "".join(d.get("content") or "" for d in deltas) == (content or "")
        (streamed,) = joined_calls(deltas)
        assert json.loads(streamed["arguments"]) == ARGUMENTS and finishes[-1] == "tool_calls"
        assert streamed["id"] == call["id"] or parser != "kimi_k2"
    async with router_env(tmp_path, 1, walking(tok), **flags) as env:
        status, text = await post(
            env,
            tools=[FORECAST, ALARM],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=300,  # the XML formats are long in a tiny vocabulary
        )
        assert status == 200, text
        out = json.loads(text)["choices"][0]
        assert len(out["message"]["tool_calls"]) == 1
        assert out["finish_reason"] == "tool_calls", out
        for call in out["message"]["tool_calls"]:
            schema = {"forecast": FORECAST_PARAMETERS, "set_alarm": ALARM["function"]["parameters"]}
            jsonschema.validate(
                json.loads(call["function"]["arguments"]), schema[call["function"]["name"]]
            )
        assert env.violations() == []
