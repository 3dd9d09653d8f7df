"""The mistral parser: `[TOOL_CALLS]` and a JSON list of calls, or `name[ARGS]{...}`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.tool_calls.mistral import MistralParser
from router.tool_calls.types import Parsed, TextDelta, ToolCall
from tests.router.tool_calls.checks import check_all_splits, check_stream, cut, cut_points

PARSER = MistralParser()
WEATHER = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'
WEATHER_CALL = ToolCall("get_weather", '{"city": "Paris"}')
TIME_CALL = ToolCall("time", "{}")

WHOLE = [
    ("No tools needed [TOOLS] here.", Parsed("No tools needed [TOOLS] here.", [])),
    (WEATHER, Parsed(None, [WEATHER_CALL])),
    ("Checking. " + WEATHER, Parsed("Checking.", [WEATHER_CALL])),
    (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "time", "arguments": {}}]',
        Parsed(None, [WEATHER_CALL, TIME_CALL]),
    ),
    (
        '[TOOL_CALLS][{"name": "say", "arguments": {"text": "ça va? 😀"}}]',
        Parsed(None, [ToolCall("say", '{"text": "ça va? 😀"}')]),
    ),
    # The v11+ form, one marker per call.
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', Parsed(None, [WEATHER_CALL])),
    (
        'Two: [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]time[ARGS]{}',
        Parsed("Two:", [WEATHER_CALL, TIME_CALL]),
    ),
    (WEATHER + " and then", Parsed("and then", [WEATHER_CALL])),
]

MALFORMED = [
    '[TOOL_CALLS] [{"name": "f", "arguments": {"a": }}]',  # bad JSON
    '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}',  # cut short
    '[TOOL_CALLS] [{"arguments": {"a": 1}}]',  # no name
    '[TOOL_CALLS] [{"name": "f", "arguments": [1]}]',  # arguments not an object
    '[TOOL_CALLS] [{"name": "f", "arguments": {}}, 3]',  # one item not a call
    "[TOOL_CALLS] []",
    "[TOOL_CALLS]",
    "[TOOL_CALLS]f[ARGS][1]",
    "[TOOL_CALLS]two words[ARGS]{}",
    "[TOOL_CALLS]f[ARGS]{",
    "[TOOL_C",
]


@pytest.mark.parametrize(("text", "expected"), WHOLE)
def test_parse_whole(text, expected):
    assert PARSER.parse(text) == expected


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_stays_text(text):
    assert PARSER.parse(text) == Parsed(text, [])


def test_bad_marker_is_content_up_to_the_next():
    text = "[TOOL_CALLS] oops [TOOL_CALLS]time[ARGS]{}"
    assert PARSER.parse(text) == Parsed("[TOOL_CALLS] oops", [TIME_CALL])


@pytest.mark.parametrize("text", [t for t, _ in WHOLE] + MALFORMED)
def test_stream_every_split(text):
    check_all_splits(PARSER, text)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), text=st.sampled_from([t for t, _ in WHOLE] + MALFORMED))
def test_stream_random_splits(data, text):
    check_stream(PARSER, text, cut(text, data.draw(cut_points(text))))


def test_text_before_the_marker_flows():
    stream = PARSER.stream()
    assert stream.push("Let me see [TOOL") == [TextDelta("Let me see")]
    assert stream.push('_CALLS] [{"name": "time", "arguments": {}}]') == []
    assert stream.finish()[0].name == "time"
