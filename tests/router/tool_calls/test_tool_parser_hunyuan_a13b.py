"""The hunyuan_a13b parser (Hunyuan-A13B): `<tool_calls>` a JSON list `</tool_calls>`."""

from __future__ import annotations

from router.tool_calls.hunyuan_a13b import HunyuanA13BParser
from router.tool_calls.types import Parsed, TextDelta, ToolCall

PARSER = HunyuanA13BParser()
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
WEATHER_CALL = ToolCall("get_weather", '{"city": "Paris"}')


def block(*calls: str) -> str:
    return "<tool_calls>[" + ", ".join(calls) + "]</tool_calls>"


WHOLE = [
    ("Just text.", Parsed("Just text.", [])),
    (block(WEATHER), Parsed(None, [WEATHER_CALL])),
    ("Let me check.\n" + block(WEATHER), Parsed("Let me check.", [WEATHER_CALL])),
    (
        block(WEATHER, '{"name": "time", "arguments": {}}'),
        Parsed(None, [WEATHER_CALL, ToolCall("time", "{}")]),
    ),
    (
        "<tool_calls>\n" + f"[{WEATHER}]\n</tool_calls>\n" + block('{"name": "ping"}') + " Done.",
        Parsed("Done.", [WEATHER_CALL, ToolCall("ping", "{}")]),
    ),
    # arguments as an object's JSON text, as vLLM takes them
    (
        block('{"name": "f", "arguments": "{\\"q\\": \\"日本 🚀\\"}"}'),
        Parsed(None, [ToolCall("f", '{"q": "日本 🚀"}')]),
    ),
    # an argument holding the closer itself
    (
        block('{"name": "echo", "arguments": {"text": "a </tool_calls> b"}}') + " ok",
        Parsed("ok", [ToolCall("echo", '{"text": "a </tool_calls> b"}')]),
    ),
]

MALFORMED = [
    block('{"name": "f", "arguments": {"a": }}'),  # bad JSON
    f"<tool_calls>[{WEATHER}]",  # never closed
    block('{"arguments": {"a": 1}}'),  # no name
    block('{"name": "f", "arguments": "not json"}'),
    block('{"name": "f", "arguments": [1]}'),
    block(WEATHER, "2"),  # an item that is not a call
    f"<tool_calls>{WEATHER}</tool_calls>",  # an object, not a list
    "<tool_calls>[]</tool_calls>",
    "<tool_calls",
    "</tool_calls> stray closer",
]


def test_malformed_next_to_good_block():
    bad = "<tool_calls>[oops]</tool_calls>"
    assert PARSER.parse(f"{bad}\n{block(WEATHER)}") == Parsed(bad, [WEATHER_CALL])


def test_content_flows_until_a_block_opens():
    stream = PARSER.stream()
    assert stream.push("Sure <tool") == [TextDelta("Sure")]
    assert stream.push("s> here") == [TextDelta(" <tools> here")]
    assert stream.push(" " + block(WEATHER)[:-1]) == []
    deltas = stream.push(">")
    assert [d.name for d in deltas] == ["get_weather", None]
    assert stream.finish() == []
