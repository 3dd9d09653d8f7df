"""--reasoning-parser on /v1/chat/completions against fake shards writing a scripted answer:
the think block goes to `reasoning_content`, whole and streamed, and a grammar (response_format,
an enforced tool_choice) constrains only what follows it."""

from __future__ import annotations

import json

import jsonschema
import pytest

from launcher.chat_families import family_tokenizer, save_family
from router.limits import ConfigError
from tests.router.harness import async_test, router_env
from tests.router.test_chat_tools import (
    ALARM,
    FORECAST_PARAMETERS,
    joined_calls,
    post,
    scripted,
    stream_deltas,
)

SCHEMA = {"type": "json_schema", "json_schema": {"name": "f", "schema": FORECAST_PARAMETERS}}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    out = {}
    for name in ("qwen", "deepseek_r1"):
        path = tmp_path_factory.mktemp(name)
        save_family(name, path)
        out[name] = path, family_tokenizer(name)
    return out


def streamed(text: str) -> tuple[str, str]:
    deltas, _ = stream_deltas(text)
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    return reasoning, "".join(d.get("content") or "" for d in deltas)


@async_test
async def test_think_block_goes_to_reasoning_content(families):
    path, tok = families["qwen"]
    answer = "<think>\nThe user asks about Paris.\n</think>\n\nParis is sunny."
    async with router_env(path, 1, scripted(tok, answer), reasoning_parser="qwen3") as env:
        status, text = await post(env)
        assert status == 200, text
        message = json.loads(text)["choices"][0]["message"]
        assert message["reasoning_content"] == "The user asks about Paris."
        assert message["content"] == "Paris is sunny."
        status, text = await post(env, stream=True)
        assert status == 200, text
        assert streamed(text) == ("The user asks about Paris.", "Paris is sunny.")
    # Qwen3 without thinking (its template closes an empty think block in the prompt): all
    # of the answer is content.
    async with router_env(path, 1, scripted(tok, "Sunny."), reasoning_parser="qwen3") as env:
        status, text = await post(env, chat_template_kwargs={"enable_thinking": False})
        assert status == 200, text
        prompt = tok.decode(env.shards[0].prefilled[-1].input_ids)
        assert prompt.endswith("<think>\n\n</think>\n\n")
        message = json.loads(text)["choices"][0]["message"]
        assert message["content"] == "Sunny." and message["reasoning_content"] is None


@async_test
async def test_a_prompt_that_opens_the_think_block(families):
    """DeepSeek-R1's template ends the prompt with `<think>\\n`: the answer starts in it."""
    path, tok = families["deepseek_r1"]
    answer = "Check the forecast.\n</think>\n\nTake an umbrella."
    async with router_env(path, 1, scripted(tok, answer), reasoning_parser="deepseek_r1") as env:
        for stream in (False, True):
            status, text = await post(env, stream=stream)
            assert status == 200, text
            if stream:
                got = streamed(text)
            else:
                message = json.loads(text)["choices"][0]["message"]
                got = message["reasoning_content"], message["content"]
            assert got == ("Check the forecast.", "Take an umbrella.")


@async_test
async def test_a_grammar_applies_after_the_reasoning(families):
    """The script thinks, then writes text the schema forbids: the think block passes (no mask
    while reasoning), and what follows it is forced into the schema."""
    for family, parser, answer in [
        ("qwen", "qwen3", "<think>\nhmm\n</think>\n\nnot json at all"),
        ("deepseek_r1", "deepseek_r1", "hmm\n</think>\n\nnot json at all"),
    ]:
        path, tok = families[family]
        async with router_env(path, 1, scripted(tok, answer), reasoning_parser=parser) as env:
            status, text = await post(env, response_format=SCHEMA)
            assert status == 200, text
            message = json.loads(text)["choices"][0]["message"]
            assert message["reasoning_content"] == "hmm", message
            jsonschema.validate(json.loads(message["content"]), FORECAST_PARAMETERS)
            assert env.violations() == []
    # Qwen3 told not to think (its template closes an empty block before the answer): the
    # grammar holds from the first token, which may not open another block.
    path, tok = families["qwen"]
    answer = "<think>\nhmm\n</think>\n\nnot json at all"
    async with router_env(path, 1, scripted(tok, answer), reasoning_parser="qwen3") as env:
        no_think = {"chat_template_kwargs": {"enable_thinking": False}}
        status, text = await post(env, response_format=SCHEMA, **no_think)
        assert status == 200, text
        message = json.loads(text)["choices"][0]["message"]
        assert message["reasoning_content"] is None, message
        jsonschema.validate(json.loads(message["content"]), FORECAST_PARAMETERS)
    # And under an enforced tool choice, with the calls streamed after the reasoning.
    path, tok = families["qwen"]
    answer = "<think>\nAn alarm.\n</think>\n\nnope"
    flags = {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}
    async with router_env(path, 1, scripted(tok, answer), **flags) as env:
        status, text = await post(
            env, stream=True, tools=[ALARM], tool_choice="required", parallel_tool_calls=False
        )
        assert status == 200, text
        deltas, finishes = stream_deltas(text)
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == "An alarm."
        (call,) = joined_calls(deltas)
        assert call["name"] == "set_alarm" and finishes[-1] == "tool_calls"
        jsonschema.validate(json.loads(call["arguments"]), ALARM["function"]["parameters"])


# vLLM's other families' layouts, on the tiny families' tokenizers: DeepSeek-R1's template opens
# the block in the prompt (as Step3's, ERNIE's, Kimi's and MiniMax-M2's do), Qwen's does not.
FAMILY_ANSWERS = [
    ("deepseek_r1", "step3", "Check.\n</think>\n\nUmbrella.", "Check.", "Umbrella."),
    ("deepseek_r1", "kimi_k2", "Check.\n</think>\n\n(no content)Umbrella.", "Check.", "Umbrella."),
    (
        "deepseek_r1",
        "ernie45",
        "Check.\n</think>\n\n<response>\nUmbrella.\n</response>\n",
        "Check.",
        "Umbrella.",
    ),
    (
        "deepseek_r1",
        "minimax_m2_append_think",
        "Check.\n</think>\n\nUmbrella.",
        None,
        "<think>Check.\n</think>\n\nUmbrella.",
    ),
    ("qwen", "deepseek_v3", "<think>\nCheck.\n</think>\n\nUmbrella.", "Check.", "Umbrella."),
    (
        "qwen",
        "hunyuan_a13b",
        "<think>\nCheck.\n</think>\n<answer>\nUmbrella.\n</answer>",
        "Check.",
        "Umbrella.",
    ),
    (
        "qwen",
        "granite",
        "Here is my thought process:\nCheck.\n\nHere is my response:\nUmbrella.",
        "Check.",
        "Umbrella.",
    ),
    ("qwen", "olmo3", "Check.</think>Umbrella.", "Check.", "Umbrella."),
]


@pytest.mark.parametrize("family,parser,answer,reasoning,content", FAMILY_ANSWERS)
@async_test
async def test_each_family_whole_and_streamed(families, family, parser, answer, reasoning, content):
    path, tok = families[family]
    async with router_env(path, 1, scripted(tok, answer), reasoning_parser=parser) as env:
        for stream in (False, True):
            status, text = await post(env, stream=stream)
            assert status == 200, text
            if stream:
                got = streamed(text)
                got = got[0] or None, got[1] or None
            else:
                message = json.loads(text)["choices"][0]["message"]
                got = message["reasoning_content"], message["content"]
            assert got == (reasoning, content), (parser, stream)


@pytest.mark.parametrize(
    "parser,answer",
    [
        ("granite", "Here is my thought process: hmm Here is my response: not json at all"),
        # Olmo 3's answers otherwise start inside the think block its template opens
        ("olmo3", "hmm</think>not json at all"),
    ],
)
@async_test
async def test_plain_text_markers_leave_a_grammar_the_whole_answer(families, parser, answer):
    """Plain-text markers are no tokens to wait for: the schema holds from the first token, and
    the answer, which then cannot think, is all content."""
    path, tok = families["qwen"]
    async with router_env(path, 1, scripted(tok, answer), reasoning_parser=parser) as env:
        status, text = await post(env, response_format=SCHEMA)
        assert status == 200, text
        message = json.loads(text)["choices"][0]["message"]
        assert message["reasoning_content"] is None, message
        jsonschema.validate(json.loads(message["content"]), FORECAST_PARAMETERS)
        assert env.violations() == []


@pytest.mark.parametrize("parser", ["qwen3", "mistral", "step3"])
@async_test
async def test_a_tokenizer_without_think_tokens_is_refused_at_startup(model_dir, parser):
    with pytest.raises(ConfigError, match=f"--reasoning-parser {parser}"):
        async with router_env(model_dir, 1, reasoning_parser=parser):
            pass
