"""The granite parser (Granite 3.x): `<|tool_call|>` or `<tool_call>`, then a JSON list."""

from __future__ import annotations

from router.tool_calls.granite import GraniteParser
from router.tool_calls.types import Parsed, TextDelta, ToolCall

PARSER = GraniteParser()
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
WEATHER_CALL = ToolCall("get_weather", '{"city": "Paris"}')
TIME = '{"name": "time", "arguments": {"zone": "Europe/Paris"}}'
TIME_CALL = ToolCall("time", '{"zone": "Europe/Paris"}')

WHOLE = [
    ("It is sunny.", Parsed("It is sunny.", [])),
    ("[1] A footnote", Parsed("[1] A footnote", [])),
    (f"<|tool_call|>[{WEATHER}]", Parsed(None, [WEATHER_CALL])),
    (f"<tool_call>[{WEATHER}]", Parsed(None, [WEATHER_CALL])),
    (f" <|tool_call|> <tool_call>\n[ {WEATHER} ]", Parsed(None, [WEATHER_CALL])),
    (f"[{WEATHER}, {TIME}]", Parsed(None, [WEATHER_CALL, TIME_CALL])),
    (
        '<|tool_call|>[{"name": "say", "arguments": {"text": "Grüße ] 世界 🙂", "n": [1, null]}}]',
        Parsed(None, [ToolCall("say", '{"text": "Grüße ] 世界 🙂", "n": [1, null]}')]),
    ),
    ('<|tool_call|>[{"name": "ping"}]', Parsed(None, [ToolCall("ping", "{}")])),
    (f"<|tool_call|>[{WEATHER}]\nDone.", Parsed("Done.", [WEATHER_CALL])),
]

MALFORMED = [
    '<|tool_call|>[{"name": "f", "arguments": {"a": }}]',  # bad JSON
    f"<|tool_call|>[{WEATHER}",  # never closed
    '<|tool_call|>[{"arguments": {"a": 1}}]',  # no name
    '<|tool_call|>[{"name": "f", "arguments": [1]}]',  # arguments not an object
    f"<|tool_call|>[{WEATHER}, 3]",  # an item that is not a call
    '<|tool_call|>[{"name": "f", "arguments": {"x": NaN}}]',
    "<|tool_call|>[]",
    "<|tool_call|>",
    "<|tool_call|> Let me think.",
    f"<|tool_call|>{WEATHER}",  # an object, not a list
    # A list not at the start is not read: the answer is content.
    f"Here you go: <|tool_call|>[{WEATHER}]",
]


def test_text_flows_at_once():
    stream = PARSER.stream()
    assert stream.push(" ") == []
    assert stream.push("Hi") == [TextDelta("Hi")]
    assert stream.push(f" [{WEATHER}]") == [TextDelta(f" [{WEATHER}]")]


def test_a_list_that_is_not_calls_flows_early():
    stream = PARSER.stream()
    assert stream.push("<|tool") == []
    assert stream.push("_call|> [") == []
    assert stream.push('"a"]') == [TextDelta('<|tool_call|> ["a"]')]


def test_calls_are_told_when_the_list_closes():
    stream = PARSER.stream()
    text = f"<|tool_call|>[{WEATHER}, {TIME}]"
    assert stream.push(text[:-1]) == []
    deltas = stream.push(text[-1])
    assert [d.name for d in deltas] == ["get_weather", None, "time", None]
    assert stream.push(" and more") == [TextDelta("and more")]
    assert stream.finish() == []
