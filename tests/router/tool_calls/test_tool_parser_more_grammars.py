"""The grammars of the Llama 4, Granite, Phi-4-mini, Hunyuan-A13B and Olmo 3 parsers under
llguidance, checked as test_tool_parser_grammars checks the others: they compile, take what the
parser reads as calls and refuse what they must, a random walk through them parses into valid
calls, and an enforced stream tells the calls parse() finds."""

from __future__ import annotations

import json
import random

import llguidance
import llguidance.hf
import pytest
from tokenizers import AddedToken

from launcher.tiny_models import build_tokenizer
from router.tool_calls.enforced_stream import ARGUMENT_HEADS
from router.tool_calls.hermes import CLOSE, OPEN
from router.tool_calls.registry import TOOL_PARSERS, tool_parser
from tests.router.tool_calls.test_tool_parser_grammars import (
    ARGS,
    EOS,
    OSLO,
    TOOLS,
    check_calls,
    marker_of,
    streamed_calls,
    takes,
    walk,
)

WEATHER = f'{{"name": "get_weather", "arguments": {ARGS}}}'
BOTH = f'{{"name": "ping", "arguments": {{}}}}, {{"name": "get_weather", "arguments": {OSLO}}}'
WEATHER_PY = 'get_weather(city="Paris", days=3, unit="c")'
OSLO_PY = 'get_weather(city="Oslo", days=0, unit="f", note="ok")'
ACCEPTED = {
    "llama4_pythonic": [f"[{WEATHER_PY}]", f"[ping(), {OSLO_PY}]"],
    "llama4_json": [
        f'{{"name": "get_weather", "parameters": {ARGS}}}',
        f'{{"name": "ping", "parameters": {{}}}}; {{"name": "get_weather", "parameters": {ARGS}}}',
    ],
    "granite": [f"<|tool_call|>[{WEATHER}]", f"<|tool_call|>[{BOTH}]"],
    "phi4_mini_json": [f"functools[{WEATHER}]", f"functools[{BOTH}]"],
    "hunyuan_a13b": [f"<tool_calls>[{WEATHER}]</tool_calls>", f"<tool_calls>[{BOTH}]</tool_calls>"],
    "olmo3": [
        f"<function_calls>\n{WEATHER_PY}\n</function_calls>",
        f"<function_calls>\nping()\n{OSLO_PY}\n</function_calls>",
    ],
}
JSON_NAMES = [name for name in ACCEPTED if name in ARGUMENT_HEADS]


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tokenizer(512)
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in (OPEN, CLOSE)])
    special = {m for parser in TOOL_PARSERS.values() for m in parser.markers} - {OPEN, CLOSE}
    tok.add_special_tokens({"additional_special_tokens": sorted(special)})
    return tok


@pytest.fixture(scope="module")
def ll_tokenizer(tokenizer):
    return llguidance.hf.from_tokenizer(tokenizer, eos_token=[EOS])


def grammar_of(tokenizer, name: str, tools=TOOLS, parallel=True):
    parser = tool_parser(name).for_tools(tools)
    return parser, parser.grammar(tools, parallel, marker_of(tokenizer, set()))


def test_every_new_name_has_cases():
    assert set(ACCEPTED) <= set(TOOL_PARSERS)
    assert set(JSON_NAMES) == {"llama4_json", "granite", "phi4_mini_json", "hunyuan_a13b"}


@pytest.mark.parametrize("name", ACCEPTED)
@pytest.mark.parametrize("parallel", [True, False])
def test_new_grammar_compiles(tokenizer, ll_tokenizer, name, parallel):
    _, grammar = grammar_of(tokenizer, name, parallel=parallel)
    lark = llguidance.LLMatcher.grammar_from_lark(grammar)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(lark, ll_tokenizer)
    assert not is_error, messages


@pytest.mark.parametrize("name", ACCEPTED)
def test_new_grammar_takes_what_the_parser_reads(tokenizer, ll_tokenizer, name):
    parser, grammar = grammar_of(tokenizer, name)
    for text in ACCEPTED[name]:
        check_calls(parser, text)
        assert takes(ll_tokenizer, tokenizer, grammar, text), text


@pytest.mark.parametrize("name", ACCEPTED)
def test_new_grammar_refuses_what_it_must(tokenizer, ll_tokenizer, name):
    _, single = grammar_of(tokenizer, name, parallel=False)
    one, two = ACCEPTED[name]
    assert takes(ll_tokenizer, tokenizer, single, one)
    assert not takes(ll_tokenizer, tokenizer, single, two)  # two calls, one allowed
    assert not takes(ll_tokenizer, tokenizer, single, one.replace("get_weather", "get_weathe"))
    assert '"c"' in one
    assert not takes(ll_tokenizer, tokenizer, single, one.replace('"c"', '"k"'))
    _, named = grammar_of(tokenizer, name, tools=[TOOLS[1]], parallel=False)
    assert not takes(ll_tokenizer, tokenizer, named, one)


@pytest.mark.parametrize("name", ACCEPTED)
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_new_random_walks_parse_into_valid_calls(tokenizer, ll_tokenizer, name, parallel, seed):
    parser, grammar = grammar_of(tokenizer, name, parallel=parallel)
    text = walk(tokenizer, ll_tokenizer, grammar, seed)
    check_calls(parser, text, most=None if parallel else 1)


@pytest.mark.parametrize("name", JSON_NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_new_enforced_calls_stream_in_fragments(tokenizer, ll_tokenizer, name, seed):
    parser, grammar = grammar_of(tokenizer, name, parallel=True)
    rng = random.Random(seed)
    for text in [*ACCEPTED[name], walk(tokenizer, ll_tokenizer, grammar, seed)]:
        whole = [(c.name, json.loads(c.arguments)) for c in parser.parse(text).calls]
        assert whole, text
        every_char = list(range(1, len(text)))
        at_random = sorted(rng.sample(every_char, min(len(every_char), rng.randint(1, 8))))
        for cuts in (every_char, at_random, []):
            assert streamed_calls(parser, text, cuts) == whole, (text, cuts)
