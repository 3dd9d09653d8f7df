"""The deepseek_v3 parser (DeepSeek-V3, R1-0528): typed calls with a JSON code block."""

from __future__ import annotations

from router.tool_calls.deepseek import DeepSeekV3Parser
from router.tool_calls.types import Parsed, ToolCall

PARSER = DeepSeekV3Parser()


def call(name: str, arguments: str) -> str:
    return (f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```"
            "<｜tool▁call▁end｜>")  # fmt: skip


def section(*calls: str, sep: str = "\n") -> str:
    return "<｜tool▁calls▁begin｜>" + sep.join(calls) + "<｜tool▁calls▁end｜>"


WHOLE = [
    ("Nothing.", Parsed("Nothing.", [])),
    (
        "Let me see." + section(call("get_weather", '{"city": "Paris"}'), call("now", "{}")),
        Parsed("Let me see.", [ToolCall("get_weather", '{"city": "Paris"}'),
                               ToolCall("now", "{}")]),
    ),
    # An argument holding a call's end marker as text.
    (
        section(call("say", '{"text": "<｜tool▁call▁end｜>"}')),
        Parsed(None, [ToolCall("say", '{"text": "<｜tool▁call▁end｜>"}')]),
    ),
]  # fmt: skip
MALFORMED = [
    section(call("f", '{"a": }')),  # bad JSON
    section(call("f", "[1]")),  # not an object
    section(call("f", "{}")).removesuffix("<｜tool▁calls▁end｜>"),  # never closed
    section(call("f", "{}"), "stray"),
    "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>",  # no call
]
