"""DeepSeek-V3.2's chat encoding (its release has no Jinja template): prompts equal to what
DeepSeek's own encoder writes, tool calls it renders parsed back, and the chat endpoint serving
a checkpoint that has only the encoding: tools rendered, DSML calls parsed (chosen by the model
or enforced by a grammar), thinking switched by `chat_template_kwargs`, refusals as 422s."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from launcher.tiny_models import build_tokenizer
from router.chat_encoding.deepseek_v32 import ASSISTANT, BOS, EOS, THINK_END, USER, render
from router.tokenizer import Tokenizer
from router.tool_calls.deepseek_v32 import DeepSeekV32Parser
from router.tool_calls.types import Tool
from tests.router.harness import async_test, router_env
from tests.router.test_chat_tools import (
    ALARM,
    FORECAST,
    FORECAST_PARAMETERS,
    joined_calls,
    post,
    scripted,
    stream_deltas,
    walking,
)

GOLDEN = json.loads((Path(__file__).parent / "data" / "deepseek_v32_prompts.json").read_text())
CASES = GOLDEN["cases"]


IDS = [f"{c['conversation']}-think{c['thinking']}-tools{c['tools']}" for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_prompts_equal_deepseeks_encoder(case):
    messages = GOLDEN["conversations"][case["conversation"]]
    tools = GOLDEN["tools"] if case["tools"] else None
    assert render(messages, {"thinking": case["thinking"]}, tools) == case["prompt"]


def test_enable_thinking_is_the_same_switch():
    messages = GOLDEN["conversations"]["multi"]
    assert render(messages, {"enable_thinking": True}, None) == render(
        messages, {"thinking": True}, None
    )
    assert render(messages, {}, None).endswith(f"{USER}Q2{ASSISTANT}{THINK_END}")


def test_rendered_calls_parse_back():
    """The encoder's calls, as the model would write them after the prompt, are the calls the
    parser reads: names, and arguments value for value (strings, numbers, objects, null)."""
    messages = GOLDEN["conversations"]["unicode_nested"]
    (assistant,) = [m for m in messages if m["role"] == "assistant"]
    prompt = render(messages[:2], {}, None)
    answer = prompt.split(f"{ASSISTANT}{THINK_END}", 1)[1].removesuffix(EOS)
    parsed = DeepSeekV32Parser().for_tools([Tool("book")]).parse(answer)
    assert parsed.content is None
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in assistant["tool_calls"]
    ]


@pytest.mark.parametrize(
    ("messages", "variables", "error"),
    [
        ([{"role": "user", "content": "q"}], {"reasoning_effort": "high"}, "reasoning_effort"),
        ([{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}], {},
         "without a call"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
         {"thinking": True}, "reasoning_content"),
        ([{"role": "function", "content": "x"}], {}, "no role 'function'"),
        ([{"role": "developer", "content": ""}], {}, "developer message needs content"),
    ],
)  # fmt: skip
def test_conversations_the_encoder_refuses(messages, variables, error):
    with pytest.raises(ValueError, match=error):
        render(messages, variables, None)


def v32_tokenizer():
    tok = build_tokenizer(512)
    specials = [BOS, EOS, USER, ASSISTANT, "<think>", THINK_END]
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.bos_token, tok.eos_token = BOS, EOS
    tok.chat_template = None
    return tok


@pytest.fixture(scope="module")
def v32(tmp_path_factory):
    """A checkpoint directory as DeepSeek-V3.2 ships it: a tokenizer without a chat template
    and a config naming the model type."""
    path = tmp_path_factory.mktemp("dsv32")
    tok = v32_tokenizer()
    tok.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"model_type": "deepseek_v32"}))
    return path, tok


def test_tokenizer_uses_the_encoding_only_without_a_template(v32, tmp_path):
    path, tok = v32
    messages = [{"role": "user", "content": "Hi"}]
    loaded = Tokenizer.from_dir(path)
    assert loaded.has_chat_template and loaded.chat_template_reads("tools", None)
    assert loaded._render_chat(messages, {}, None) == f"{BOS}{USER}Hi{ASSISTANT}{THINK_END}"
    # A fine-tune that ships its own Jinja template is rendered with it.
    tok.chat_template = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    assert Tokenizer.from_dir(tmp_path)._render_chat(messages, {}, None) == "[Hi]"
    # Another model type without a template still has none.
    other = tmp_path / "other"
    v32_tokenizer().save_pretrained(other)
    (other / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert not Tokenizer.from_dir(other).has_chat_template


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}}  # fmt: skip
CALLS = (
    '\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜function_calls>"
)
DSML_FLAGS = {
    "tool_call_parser": "deepseek_v32",
    "enable_auto_tool_choice": True,
    "max_input_tokens": 3000,
}  # the tools preamble is long in a tiny vocabulary


@async_test
async def test_chat_renders_tools_and_reads_dsml_calls(v32):
    path, tok = v32
    async with router_env(path, 1, scripted(tok, "Looking." + CALLS), **DSML_FLAGS) as env:
        for stream in (False, True):
            status, text = await post(env, stream=stream, tools=[WEATHER], max_tokens=400)
            assert status == 200, text
            if stream:
                deltas, finishes = stream_deltas(text)
                assert "".join(d.get("content") or "" for d in deltas) == "Looking."
                calls = joined_calls(deltas)
            else:
                choice = json.loads(text)["choices"][0]
                finishes = [choice["finish_reason"]]
                assert choice["message"]["content"] == "Looking."
                calls = [c["function"] for c in choice["message"]["tool_calls"]]
            assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
                ("get_weather", {"city": "Paris", "days": 3})
            ]
            assert finishes[-1] == "tool_calls"
        prompt = tok.decode(env.shards[0].prefilled[-1].input_ids)
        assert prompt.startswith(f"{BOS}\n\n## Tools\n") and '"name": "get_weather"' in prompt
        assert prompt.endswith(f"{USER}Weather in Paris?{ASSISTANT}{THINK_END}")


@async_test
async def test_required_choice_writes_dsml_under_a_grammar(v32):
    path, tok = v32
    flags = {"tool_call_parser": "deepseek_v32", "max_input_tokens": 3000}
    async with router_env(path, 1, walking(tok), **flags) as env:
        status, text = await post(env, tools=[FORECAST, ALARM], tool_choice="required",
                                  parallel_tool_calls=False, max_tokens=300)  # fmt: skip
        assert status == 200, text
        (call,) = json.loads(text)["choices"][0]["message"]["tool_calls"]
        arguments = json.loads(call["function"]["arguments"])
        schema = {"forecast": FORECAST_PARAMETERS, "set_alarm": ALARM["function"]["parameters"]}
        jsonschema.validate(arguments, schema[call["function"]["name"]])
        # The grammar wrote the integer as JSON (string="false"), so it reads back a number.
        assert any(isinstance(v, int) and not isinstance(v, bool) for v in arguments.values())


@async_test
async def test_thinking_history_and_refusals(v32):
    """Thinking on: the prompt opens the block, the reasoning parser splits the answer, and an
    agent's tool round in progress reaches the model with its reasoning; refusals are 422s."""
    path, tok = v32
    flags = {**DSML_FLAGS, "reasoning_parser": "deepseek_v3"}
    async with router_env(path, 1, scripted(tok, "Hmm.</think>Sunny."), **flags) as env:
        history = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "reasoning_content": "Ask the tool.",
             "tool_calls": [{"id": "c0", "type": "function", "function": {
                 "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
        ]  # fmt: skip
        status, text = await post(env, messages=history, tools=[WEATHER],
                                  chat_template_kwargs={"thinking": True})  # fmt: skip
        assert status == 200, text
        message = json.loads(text)["choices"][0]["message"]
        assert (message["reasoning_content"], message["content"]) == ("Hmm.", "Sunny.")
        prompt = tok.decode(env.shards[0].prefilled[-1].input_ids)
        assert f"{ASSISTANT}<think>Ask the tool.{THINK_END}\n\n<｜DSML｜function_calls>" in prompt
        assert prompt.endswith("<result>sunny</result>\n</function_results>\n\n<think>")

        for body, error in [
            ({"chat_template_kwargs": {"reasoning_effort": "high"}}, "reasoning_effort"),
            ({"messages": [{"role": "tool", "tool_call_id": "x", "content": "r"}]},
             "without a call"),
        ]:  # fmt: skip
            status, text = await post(env, **body)
            assert status == 422 and error in json.loads(text)["error"], text
