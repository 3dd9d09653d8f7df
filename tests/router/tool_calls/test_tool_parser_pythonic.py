"""The pythonic parser (Llama 3.2, Llama 4): `[f(a=1), g(b="x")]`, read with `ast`."""

from __future__ import annotations

from router.tool_calls.pythonic import PythonicParser
from router.tool_calls.types import Parsed, TextDelta, ToolCall

PARSER = PythonicParser()
WEATHER = '[get_weather(city="Paris", unit="c")]'
WEATHER_CALL = ToolCall("get_weather", '{"city": "Paris", "unit": "c"}')

WHOLE = [
    ("It is sunny.", Parsed("It is sunny.", [])),
    ("[1] A footnote", Parsed("[1] A footnote", [])),
    (WEATHER, Parsed(None, [WEATHER_CALL])),
    (
        "[get_weather(city='Paris', unit=\"c\"), other(x=1, y=-2.5, z=True, w=None)]",
        Parsed(
            None,
            [WEATHER_CALL, ToolCall("other", '{"x": 1, "y": -2.5, "z": true, "w": null}')],
        ),
    ),
    (
        '[f(a=true, b=false, c=null, d=[1, (2, 3)], e={"k": {"n": "ü"}})]',
        Parsed(
            None,
            [
                ToolCall(
                    "f",
                    '{"a": true, "b": false, "c": null, "d": [1, [2, 3]], "e": {"k": {"n": "ü"}}}',
                )
            ],
        ),
    ),
    ("[ping()]", Parsed(None, [ToolCall("ping", "{}")])),
    (
        '<|python_start|>[say(text="日本 🚀")]<|python_end|>',
        Parsed(None, [ToolCall("say", '{"text": "日本 🚀"}')]),
    ),
    (WEATHER + "\nHope that helps.", Parsed("Hope that helps.", [WEATHER_CALL])),
    ('[f(s="a\\/b", t="line\\n")]', Parsed(None, [ToolCall("f", '{"s": "a/b", "t": "line\\n"}')])),
]

MALFORMED = [
    '[get_weather("Paris")]',  # positional
    "[f(x=g())]",  # not a literal
    "[f(x=a + 1)]",
    "[f(x=__import__('os'))]",
    "[f(**kw)]",
    "[f(x={1, 2})]",  # a set
    "[f(x={1: 2})]",  # a key that is not a string
    "[f(x=1e999)]",  # infinite
    "[f(x=b'bytes')]",
    "[obj.method(x=1)]",
    "[f(x=1), 2]",
    "[f(x=1, x=2)]",
    "[f(x=1)",  # never closed
    "[]",
    "[f]",
    "<|python_start|>",
    "<|python_start|>print('hi')<|python_end|>",
]


def test_a_list_that_cannot_be_calls_flows_early():
    stream = PARSER.stream()
    assert stream.push("[see") == []  # may still be `[see(`
    assert stream.push(" below]") == [TextDelta("[see below]")]


def test_a_list_of_calls_is_told_at_the_end():
    stream = PARSER.stream()
    assert stream.push(WEATHER) == []
    assert [d.name for d in stream.finish()] == ["get_weather", None]


def test_never_evaluates():
    # Evaluating this would raise; reading it finds a call that is not a literal: content.
    text = "[f(x=(1).__class__.__base__.__subclasses__())]"
    assert PARSER.parse(text) == Parsed(text, [])
