"""The llama3_json parser (Llama 3.1-3.3): the answer is `{"name": ..., "parameters": ...}`."""

from __future__ import annotations

from router.tool_calls.llama3_json import Llama3JsonParser
from router.tool_calls.types import Parsed, TextDelta, ToolCall

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
