"""The llama3_json parser (Llama 3.1-3.3): the answer is `{"name": ..., "parameters": ...}`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.tool_calls.llama3_json import Llama3JsonParser
from router.tool_calls.types import Parsed, TextDelta, ToolCall
from tests.router.tool_calls.checks import check_all_splits, check_stream, cut, cut_points

PARSER = Llama3JsonParser()
WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
WEATHER_CALL = ToolCall("get_weather", '{"city": "Paris"}')

WHOLE = [
    ("The weather is fine.", Parsed("The weather is fine.", [])),
    (WEATHER, Parsed(None, [WEATHER_CALL])),
    ("  <|python_tag|>" + WEATHER, Parsed(None, [WEATHER_CALL])),
    ('{"name": "f", "arguments": {"a": [1, 2]}}', Parsed(None, [ToolCall("f", '{"a": [1, 2]}')])),
    (
        WEATHER + '; {"name": "time", "parameters": {"zone": "Europe/Paris"}}',
        Parsed(None, [WEATHER_CALL, ToolCall("time", '{"zone": "Europe/Paris"}')]),
    ),
    (
        '{"name": "say", "parameters": {"text": "Grüße, 世界 🙂"}}',
        Parsed(None, [ToolCall("say", '{"text": "Grüße, 世界 🙂"}')]),
    ),
    (WEATHER + "\nDone.", Parsed("Done.", [WEATHER_CALL])),
    (WEATHER + '; {"oops"', Parsed('{"oops"', [WEATHER_CALL])),
]

MALFORMED = [
    '{"name": "f", "parameters": {"a": }}',  # bad JSON
    '{"name": "f", "parameters": {"a": 1}',  # cut short
    '{"parameters": {"a": 1}}',  # no name
    '{"name": "f", "parameters": [1]}',  # arguments not an object
    '{"name": "f", "parameters": "x"}',
    "{ just braces }",
    "<|python_tag|>",
    '<|python_tag|>brave_search.call(query="x")',  # a built-in tool: not JSON, content
    # A call not at the start is not read: the answer is content.
    "Here you go: " + WEATHER,
]


@pytest.mark.parametrize(("text", "expected"), WHOLE)
def test_parse_whole(text, expected):
    assert PARSER.parse(text) == expected


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_stays_text(text):
    assert PARSER.parse(text) == Parsed(text, [])


@pytest.mark.parametrize("text", [t for t, _ in WHOLE] + MALFORMED)
def test_stream_every_split(text):
    check_all_splits(PARSER, text)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), text=st.sampled_from([t for t, _ in WHOLE] + MALFORMED))
def test_stream_random_splits(data, text):
    check_stream(PARSER, text, cut(text, data.draw(cut_points(text))))


def test_text_answer_flows_at_once():
    stream = PARSER.stream()
    assert stream.push("  ") == []  # the answer's leading whitespace: dropped
    assert stream.push("Hi") == [TextDelta("Hi")]
    assert stream.push(" {x}") == [TextDelta(" {x}")]  # once content, always content


def test_held_while_it_may_be_a_call():
    stream = PARSER.stream()
    assert stream.push("<|python") == []
    assert stream.push("_tag|> ") == []
    assert stream.push(WEATHER) == []  # no end marker: whole only at the end
    deltas = stream.finish()
    assert [d.name for d in deltas] == ["get_weather", None]
    assert deltas[1].arguments == WEATHER_CALL.arguments
