"""The phi4_mini_json parser (Phi-4-mini): `functools[...]`, a JSON list of calls."""

from __future__ import annotations

from router.tool_calls.phi4_mini import Phi4MiniJsonParser
from router.tool_calls.types import Parsed, TextDelta, ToolCall

PARSER = Phi4MiniJsonParser()
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
WEATHER_CALL = ToolCall("get_weather", '{"city": "Paris"}')

WHOLE = [
    ("Use the functools module.", Parsed("Use the functools module.", [])),
    (f"functools[{WEATHER}]", Parsed(None, [WEATHER_CALL])),
    (f"Let me check.\nfunctools[{WEATHER}]", Parsed("Let me check.", [WEATHER_CALL])),
    (
        f'functools[{WEATHER}, {{"name": "time", "parameters": {{"zone": "UTC"}}}}]',
        Parsed(None, [WEATHER_CALL, ToolCall("time", '{"zone": "UTC"}')]),
    ),
    (
        'functools[{"name": "f", "arguments": {"xs": [[1], ["]"]], "q": "日本 🚀"}}] after',
        Parsed("after", [ToolCall("f", '{"xs": [[1], ["]"]], "q": "日本 🚀"}')]),
    ),
    (
        f'functools[{WEATHER}] and functools[{{"name": "ping"}}]',
        Parsed("and", [WEATHER_CALL, ToolCall("ping", "{}")]),
    ),
    (
        f'functools[{{"oops"}} then functools[{WEATHER}]',
        Parsed('functools[{"oops"} then', [WEATHER_CALL]),
    ),
    ("functools[x] functools[" + WEATHER + "]", Parsed("functools[x]", [WEATHER_CALL])),
]

MALFORMED = [
    'functools[{"name": "f", "arguments": {"a": }}]',  # bad JSON
    f"functools[{WEATHER}",  # never closed
    'functools[{"arguments": {"a": 1}}]',  # no name
    'functools[{"name": "f", "arguments": "x"}]',  # arguments not an object
    f"functools[{WEATHER}, 1]",  # an item that is not a call
    "functools[]",
    "functools[",
    "functools",
    "x = functools[0]",
    f"functools [{WEATHER}]",  # the list follows the word at once
]


def test_content_flows_before_the_marker():
    stream = PARSER.stream()
    assert stream.push("Sure, func") == [TextDelta("Sure,")]  # may be the marker: held
    assert stream.push("tion") == [TextDelta(" function")]
    assert stream.push(" functools") == []
    deltas = stream.push(f"[{WEATHER}]")
    assert [d.name for d in deltas] == ["get_weather", None]
    assert stream.finish() == []


def test_unclosed_list_is_content_at_finish():
    stream = PARSER.stream()
    assert stream.push('x functools[{"name": "f"') == [TextDelta("x")]
    assert stream.finish() == [TextDelta(' functools[{"name": "f"')]
