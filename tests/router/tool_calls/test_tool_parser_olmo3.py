"""The olmo3 parser (Olmo 3): pythonic calls, one a line, in `<function_calls>`."""

from __future__ import annotations

from router.tool_calls.olmo3 import Olmo3Parser
from router.tool_calls.types import Parsed, TextDelta, ToolCall

PARSER = Olmo3Parser()
WEATHER = 'get_weather(city="Paris", unit="c")'
WEATHER_CALL = ToolCall("get_weather", '{"city": "Paris", "unit": "c"}')
TIME = "get_time(zone=null, exact=true)"
TIME_CALL = ToolCall("get_time", '{"zone": null, "exact": true}')


def block(*lines: str) -> str:
    return "<function_calls>\n" + "\n".join(lines) + "\n</function_calls>"


WHOLE = [
    ("It is sunny.", Parsed("It is sunny.", [])),
    ("Hello there (friend)", Parsed("Hello there (friend)", [])),
    (block(WEATHER), Parsed(None, [WEATHER_CALL])),
    (block(WEATHER, "", TIME), Parsed(None, [WEATHER_CALL, TIME_CALL])),
    (
        "Let me look.\n" + block(WEATHER) + "\nOne moment.",
        Parsed("Let me look.\n\nOne moment.", [WEATHER_CALL]),
    ),
    (
        block("say(text='日本 🚀', n=[1, (2, 3)], m={\"k\": False})"),
        Parsed(None, [ToolCall("say", '{"text": "日本 🚀", "n": [1, [2, 3]], "m": {"k": false}}')]),
    ),
    ("<function_calls>ping()</function_calls>", Parsed(None, [ToolCall("ping", "{}")])),
    # a closer inside a string argument does not end the block
    (
        block('echo(text="a </function_calls> b")') + " ok",
        Parsed("ok", [ToolCall("echo", '{"text": "a </function_calls> b"}')]),
    ),
    # bare lines of calls, without the block, as the whole answer
    (f"{WEATHER}\n{TIME}", Parsed(None, [WEATHER_CALL, TIME_CALL])),
    (block(WEATHER) + block(TIME), Parsed(None, [WEATHER_CALL, TIME_CALL])),
]

MALFORMED = [
    block('get_weather("Paris")'),  # positional
    block("f(x=g())"),  # not a literal
    block(WEATHER, "and then"),  # a line that is not a call
    block("f(x=1"),  # never closed call
    "<function_calls>\n" + WEATHER,  # never closed block
    "<function_calls></function_calls>",
    block('f(s="</function_calls>)'),  # the closer in a string that never ends
    "<function_calls",
    f"{WEATHER} is how I would call it",
    "print('hi')  # a comment",
]


def test_malformed_block_next_to_good_one():
    bad = block("nope")
    assert PARSER.parse(f"{bad}\n{block(WEATHER)}") == Parsed(bad, [WEATHER_CALL])


def test_text_answer_flows_after_its_first_word():
    stream = PARSER.stream()
    assert stream.push("Hello") == []  # may be `Hello(`
    assert stream.push(" there") == [TextDelta("Hello there")]
    assert stream.push(" <function") == []
    deltas = stream.push(block(WEATHER)[len("<function") :])
    assert [type(d).__name__ for d in deltas] == ["CallDelta", "CallDelta"]
    assert deltas[0].name == "get_weather" and deltas[1].arguments == WEATHER_CALL.arguments
    assert stream.finish() == []


def test_bare_calls_are_told_at_the_end():
    stream = PARSER.stream()
    assert stream.push(WEATHER + "\n") == []
    assert [d.name for d in stream.finish()] == ["get_weather", None]
