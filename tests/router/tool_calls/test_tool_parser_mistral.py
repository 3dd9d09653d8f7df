"""The mistral parser: `[TOOL_CALLS]` and a JSON list of calls, or `name[ARGS]{...}`."""

from __future__ import annotations

from router.tool_calls.mistral import MistralParser
from router.tool_calls.types import Parsed, TextDelta, ToolCall

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


def test_bad_marker_is_content_up_to_the_next():
    text = "[TOOL_CALLS] oops [TOOL_CALLS]time[ARGS]{}"
    assert PARSER.parse(text) == Parsed("[TOOL_CALLS] oops", [TIME_CALL])


def test_text_before_the_marker_flows():
    stream = PARSER.stream()
    assert stream.push("Let me see [TOOL") == [TextDelta("Let me see")]
    assert stream.push('_CALLS] [{"name": "time", "arguments": {}}]') == []
    assert stream.finish()[0].name == "time"
