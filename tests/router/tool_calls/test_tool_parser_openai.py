"""The openai parser (gpt-oss): the calls the harmony reasoning parser passes on in the content,
`<|channel|>commentary to=functions.NAME<|message|>ARGS<|call|>`; whole, and streamed cut
anywhere. The whole path (harmony answer -> reasoning split -> calls) is checked at the end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.reasoning.harmony import HarmonyParser
from router.tool_calls.openai import OpenAIParser
from router.tool_calls.types import Parsed, Tool, ToolCall
from tests.router.tool_calls.checks import check_all_splits, check_stream, cut, cut_points

PARSER = OpenAIParser()
ARGS = '{"city": "Paris"}'
WEATHER = f"<|channel|>commentary to=functions.get_weather<|message|>{ARGS}<|call|>"
WEATHER_CALL = ToolCall("get_weather", '{"city": "Paris"}')
TIME = "<|channel|>commentary to=functions.get_time<|message|>{}<|call|>"

WHOLE = [
    ("Just text, no call.", Parsed("Just text, no call.", [])),
    (WEATHER, Parsed(None, [WEATHER_CALL])),
    ("Let me check." + WEATHER, Parsed("Let me check.", [WEATHER_CALL])),
    (WEATHER + TIME, Parsed(None, [WEATHER_CALL, ToolCall("get_time", "{}")])),
    # arguments normalized as OpenAI's JSON text; a content type in the header is allowed
    (
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a":1,"b":"é"}<|call|>',
        Parsed(None, [ToolCall("f", '{"a": 1, "b": "é"}')]),
    ),
    (
        '<|channel|>commentary to=functions.f json<|message|> {"q": [1, null]} <|call|>',
        Parsed(None, [ToolCall("f", '{"q": [1, null]}')]),
    ),
]

MALFORMED = [
    "<|channel|>commentary to=functions.f<|message|>{bad<|call|>",  # not JSON
    '<|channel|>commentary to=functions.f<|message|>["a"]<|call|>',  # not an object
    '<|channel|>commentary to=functions.f<|message|>{"x": NaN}<|call|>',  # not JSON for OpenAI
    '<|channel|>analysis to=python<|message|>print("hi")<|call|>',  # not a function
    '<|channel|>commentary to=browser.search<|message|>{"q": "x"}<|call|>',
    '<|channel|>commentary to=functions.<|message|>{"a": 1}<|call|>',  # no name
    '<|channel|>commentary to=functions.f<|message|>{"a": 1}',  # never ended
    "<|channel|>commentary<|message|>no recipient<|call|>",
    "<|chan",
]


@pytest.mark.parametrize(("text", "expected"), WHOLE)
def test_whole_and_every_split(text: str, expected: Parsed) -> None:
    assert PARSER.parse(text) == expected
    check_all_splits(PARSER, text)


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_stays_content_as_written(text: str) -> None:
    assert PARSER.parse(text) == Parsed(text, [])
    check_all_splits(PARSER, text)


def test_malformed_next_to_a_good_call() -> None:
    bad = "<|channel|>commentary to=functions.f<|message|>{bad<|call|>"
    assert PARSER.parse(bad + WEATHER) == Parsed(bad, [WEATHER_CALL])
    # a message that never ends before the next one is not a call
    unended = "<|channel|>commentary to=functions.f<|message|>{}"
    assert PARSER.parse(unended + WEATHER) == Parsed(unended, [WEATHER_CALL])
    check_all_splits(PARSER, unended + WEATHER)


def test_content_before_a_call_flows_and_the_call_waits() -> None:
    stream = PARSER.stream()
    assert [d.text for d in stream.push("Let me check.<|chan")] == ["Let me check."]
    assert stream.push("nel|>commentary to=functions.get_weather<|message|>{") == []
    found = stream.push('"city": "Paris"}<|call|>')
    assert [(d.name, d.arguments) for d in found] == [("get_weather", ""), (None, ARGS)]
    assert stream.finish() == []


def test_grammar_writes_the_header_and_refuses_a_name_it_cannot_hold() -> None:
    grammar = PARSER.grammar([Tool("get_weather")], False, lambda marker: f"<[{len(marker)}]>")
    assert '<[11]> "commentary to=functions.get_weather " <[13]> "json" <[11]> %json' in grammar
    with pytest.raises(ValueError, match="harmony header"):
        PARSER.grammar([Tool("a b")], False, str)


# Harmony answers through both parsers, as a chat answer goes: reasoning split, then calls.
ANSWERS = [
    (
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>"
        f"commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}<|call|>",
        "Need weather.",
        Parsed(None, [WEATHER_CALL]),
    ),
    (
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant "
        f"to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}<|call|>",
        None,
        Parsed("Let me check.", [WEATHER_CALL]),
    ),
    (
        "<|channel|>final<|message|>Done.<|return|>",
        None,
        Parsed("Done.", []),
    ),
]


@pytest.mark.parametrize(("text", "reasoning", "parsed"), ANSWERS)
def test_harmony_answers_through_both_parsers(text: str, reasoning, parsed: Parsed) -> None:
    split = HarmonyParser().parse(text, False)
    assert split.reasoning == reasoning
    assert PARSER.parse(split.content or "") == parsed
    check_all_splits(PARSER, split.content or "")


_ATOMS = [WEATHER, TIME, "<|channel|>", "<|message|>", "<|call|>", "<|chan", "<|",
          " to=functions.f", "commentary", "{}", '{"a": 1}', "x", " "]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_stream_equals_parse(data: st.DataObject) -> None:
    text = data.draw(st.lists(st.sampled_from(_ATOMS), max_size=10).map("".join))
    check_stream(PARSER, text, cut(text, data.draw(cut_points(text))))
