"""Llama 4's names: llama4_pythonic (pythonic calls, maybe between `<|python_start|>` and
`<|python_end|>`) and llama4_json (vLLM's other name for llama3_json)."""

from __future__ import annotations

from router.tool_calls.llama3_json import Llama3JsonParser, Llama4JsonParser
from router.tool_calls.pythonic import Llama4PythonicParser, PythonicParser
from router.tool_calls.types import Parsed, TextDelta, ToolCall
from tests.router.tool_calls import test_tool_parser_llama3_json, test_tool_parser_pythonic

PARSER = Llama4PythonicParser()
WEATHER_CALL = ToolCall("get_weather", '{"city": "Paris"}')

WHOLE = [
    ("It is sunny.", Parsed("It is sunny.", [])),
    ('[get_weather(city="Paris")]', Parsed(None, [WEATHER_CALL])),
    ('<|python_start|>[get_weather(city="Paris")]<|python_end|>', Parsed(None, [WEATHER_CALL])),
    (
        '<|python_start|>[get_weather(city="Paris"), ping()]<|python_end|>\nChecking.',
        Parsed("Checking.", [WEATHER_CALL, ToolCall("ping", "{}")]),
    ),
    ('  <|python_start|> [get_weather(city="Paris")]', Parsed(None, [WEATHER_CALL])),
]

MALFORMED = [
    '<|python_start|>[get_weather("Paris")]<|python_end|>',
    "<|python_start|>print('hi')<|python_end|>",
    '<|python_start|>[get_weather(city="Paris")',
    'Sure: [get_weather(city="Paris")]',
]


def test_llama4_pythonic_reads_as_pythonic():
    assert issubclass(Llama4PythonicParser, PythonicParser)
    for text, expected in test_tool_parser_pythonic.WHOLE:
        assert PARSER.parse(text) == expected
    for text in test_tool_parser_pythonic.MALFORMED:
        assert PARSER.parse(text) == Parsed(text, [])


def test_llama4_json_is_llama3_json():
    parser = Llama4JsonParser()
    assert parser.name == "llama4_json" and isinstance(parser, Llama3JsonParser)
    assert parser.markers == Llama3JsonParser.markers
    for text, expected in test_tool_parser_llama3_json.WHOLE:
        assert parser.parse(text) == expected
    for text in test_tool_parser_llama3_json.MALFORMED:
        assert parser.parse(text) == Parsed(text, [])


def test_tagged_list_is_held_then_told():
    stream = PARSER.stream()
    assert stream.push("<|python_") == []
    assert stream.push('start|>[get_weather(city="Par') == []
    assert stream.push('is")]<|python_end|>') == []  # whole at the answer's end
    assert stream.push(" Bye") == []
    deltas = stream.finish()
    assert [d.name for d in deltas[:2]] == ["get_weather", None]
    assert deltas[1].arguments == WEATHER_CALL.arguments
    assert deltas[2:] == [TextDelta("Bye")]
