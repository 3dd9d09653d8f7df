"""The deepseek_v31 parser (DeepSeek-V3.1 and later): name, separator, bare JSON arguments."""

from __future__ import annotations

from router.tool_calls.deepseek import DeepSeekV31Parser
from router.tool_calls.types import Parsed, ToolCall

PARSER = DeepSeekV31Parser()


def call(name: str, arguments: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>"


def section(*calls: str) -> str:
    return "<｜tool▁calls▁begin｜>" + "".join(calls) + "<｜tool▁calls▁end｜>"


WHOLE = [
    ("Plain.", Parsed("Plain.", [])),
    (
        "Sure." + section(call("get_weather", '{"city": "Paris"}'), call("now", "{}")),
        Parsed("Sure.", [ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("now", "{}")]),
    ),
    (
        section(call("f", '{"q": "日本語 🚀", "n": [1, null]}')),
        Parsed(None, [ToolCall("f", '{"q": "日本語 🚀", "n": [1, null]}')]),
    ),
]
MALFORMED = [
    section(call("f", '{"a": }')),
    section(call("", "{}")),  # no name
    section("<｜tool▁call▁begin｜>f{}<｜tool▁call▁end｜>"),  # no separator
    section(call("f", "{}")).removesuffix("<｜tool▁calls▁end｜>"),
]
