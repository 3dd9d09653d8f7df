"""The hermes parser (Qwen2.5/3, Hermes): `<tool_call>` JSON `</tool_call>` blocks."""

from __future__ import annotations

from router.tool_calls.hermes import HermesParser
from router.tool_calls.types import Parsed, TextDelta, ToolCall

PARSER = HermesParser()
WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER_CALL = ToolCall("get_weather", '{"city": "Paris"}')

WHOLE = [
    ("Just text, no call.", Parsed("Just text, no call.", [])),
    ("  spaced  ", Parsed("  spaced  ", [])),
    (WEATHER, Parsed(None, [WEATHER_CALL])),
    ("Let me check.\n" + WEATHER, Parsed("Let me check.", [WEATHER_CALL])),
    (
        WEATHER + "\n" + '<tool_call>{"name":"time","arguments":{}}</tool_call>',
        Parsed(None, [WEATHER_CALL, ToolCall("time", "{}")]),
    ),
    (
        'A <tool_call>  {"name": "f", "arguments": {"q": "日本語 🚀", "n": [1, null]}}  '
        "</tool_call> B",
        Parsed("A  B", [ToolCall("f", '{"q": "日本語 🚀", "n": [1, null]}')]),
    ),
    ('<tool_call>{"name": "ping"}</tool_call>', Parsed(None, [ToolCall("ping", "{}")])),
    # an argument holding the closer itself, plain and between escaped quotes
    (
        '<tool_call>{"name": "echo", "arguments": {"text": "a </tool_call> b"}}</tool_call> done',
        Parsed("done", [ToolCall("echo", '{"text": "a </tool_call> b"}')]),
    ),
    (
        '<tool_call>{"name": "say", "arguments": {"q": "\\"</tool_call>\\""}}</tool_call>'
        + WEATHER,
        Parsed(None, [ToolCall("say", '{"q": "\\"</tool_call>\\""}'), WEATHER_CALL]),
    ),
]

MALFORMED = [
    '<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>',  # bad JSON
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n',  # never closed
    '<tool_call>{"arguments": {"a": 1}}</tool_call>',  # no name
    '<tool_call>{"name": 3, "arguments": {}}</tool_call>',  # name not a string
    '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',  # arguments a string
    '<tool_call>["f", {}]</tool_call>',  # not an object
    '<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>',  # not JSON for OpenAI
    "<tool_call",
    "</tool_call> stray closer",
    '<tool_call>{"name": "f", "arguments": {"s": "x</tool_call>',  # closer inside, never ended
]


def test_malformed_next_to_good_call():
    bad = "<tool_call>{not json}</tool_call>"
    found = PARSER.parse(f"{bad}\n{WEATHER}")
    assert found == Parsed(bad, [WEATHER_CALL])


def test_content_flows_before_a_marker_is_complete():
    stream = PARSER.stream()
    assert stream.push("Sure") == [TextDelta("Sure")]
    assert stream.push(" <tool") == []  # may be a marker: held, with the space before it
    assert stream.push("box>") == [TextDelta(" <toolbox>")]
    assert stream.push(" <tool") == []
    deltas = stream.push(WEATHER[len("<tool") :])
    assert [type(d).__name__ for d in deltas] == ["CallDelta", "CallDelta"]
    assert deltas[0].name == "get_weather" and deltas[1].arguments == WEATHER_CALL.arguments
    assert stream.finish() == []


def test_call_is_told_when_closed_not_before():
    stream = PARSER.stream()
    assert stream.push(WEATHER[:-1]) == []
    assert len(stream.push(WEATHER[-1])) == 2


def test_unclosed_call_is_content_at_finish():
    stream = PARSER.stream()
    assert stream.push('x <tool_call>{"name": "f"}') == [TextDelta("x")]
    assert stream.finish() == [TextDelta(' <tool_call>{"name": "f"}')]
