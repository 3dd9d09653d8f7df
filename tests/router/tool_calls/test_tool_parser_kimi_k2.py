"""The kimi_k2 parser: calls named by the id the model writes, `functions.<name>:<index>`."""

from __future__ import annotations

from router.tool_calls.kimi_k2 import KimiK2Parser
from router.tool_calls.types import Parsed, ToolCall

PARSER = KimiK2Parser()


def call(call_id: str, arguments: str) -> str:
    return (f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{arguments}"
            "<|tool_call_end|>")  # fmt: skip


def section(*calls: str) -> str:
    return "<|tool_calls_section_begin|>" + "".join(calls) + "<|tool_calls_section_end|>"


WHOLE = [
    ("No calls.", Parsed("No calls.", [])),
    (
        "On it." + section(call("functions.get_weather:0", '{"city": "Paris"}'),
                           call("functions.search.web:1", '{"q": "x"}')),
        Parsed("On it.", [ToolCall("get_weather", '{"city": "Paris"}', "functions.get_weather:0"),
                          ToolCall("search.web", '{"q": "x"}', "functions.search.web:1")]),
    ),
    (section(call("now:3", "{}")), Parsed(None, [ToolCall("now", "{}", "now:3")])),
]  # fmt: skip
MALFORMED = [
    section(call("functions.get_weather", "{}")),  # no index
    section(call("functions.f:0", '{"a": }')),
    section(call("functions.f:0", "{}")).removesuffix("<|tool_calls_section_end|>"),
]
