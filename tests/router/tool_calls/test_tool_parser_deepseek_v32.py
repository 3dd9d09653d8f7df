"""The deepseek_v32 parser: DSML `<invoke>` calls, values read by their `string` attribute."""

from __future__ import annotations

from router.tool_calls.deepseek_v32 import DeepSeekV32Parser
from router.tool_calls.types import Parsed, Tool, ToolCall

SEARCH = {"type": "object", "properties": {"query": {"type": "string"},
          "limit": {"type": "integer"}, "tags": {"type": "array"}}}  # fmt: skip
PARSER = DeepSeekV32Parser().for_tools([Tool("search", None, SEARCH)])


def param(key: str, value: str, string: bool) -> str:
    flag = "true" if string else "false"
    return f'<｜DSML｜parameter name="{key}" string="{flag}">{value}</｜DSML｜parameter>'


def invoke(name: str, *params: str) -> str:
    return f'<｜DSML｜invoke name="{name}">\n' + "\n".join(params) + "\n</｜DSML｜invoke>"


def block(*calls: str) -> str:
    return "<｜DSML｜function_calls>\n" + "\n".join(calls) + "\n</｜DSML｜function_calls>"


TWO = block(
    invoke("search", param("query", "AI news", True), param("limit", "10", False)),
    # The attribute, not the schema, says how a value was written: "42" stays a string, and a
    # string value keeps its own newlines (values are inline, not on lines of their own).
    invoke("search", param("query", "42", True), param("tags", '["a", "ü"]', False),
           param("note", "\nline\n", True), param("page", "5", False)),
)  # fmt: skip
WHOLE = [
    ("Hello.", Parsed("Hello.", [])),
    (
        "Searching.\n\n" + TWO,
        Parsed("Searching.", [ToolCall("search", '{"query": "AI news", "limit": 10}'),
                              ToolCall("search",
                                       '{"query": "42", "tags": ["a", "ü"], "note": "\\nline\\n", '
                                       '"page": 5}')]),
    ),
    (block(invoke("now")), Parsed(None, [ToolCall("now", "{}")])),
    # A value the model botched as JSON stays visible as text.
    (
        block(invoke("search", param("limit", "ten", False))),
        Parsed(None, [ToolCall("search", '{"limit": "ten"}')]),
    ),
]  # fmt: skip

MALFORMED = [
    block('<｜DSML｜invoke name="search">\n' + param("query", "x", True)),  # no </invoke>
    block(invoke("search", param("query", "x", True), "BROKEN")),
    TWO.removesuffix("</｜DSML｜function_calls>"),
    "<｜DSML｜function_calls>\n</｜DSML｜function_calls>",  # no call
    # No `string` attribute: not DSML.
    block('<｜DSML｜invoke name="search">\n<｜DSML｜parameter name="q">x</｜DSML｜parameter>\n'
          "</｜DSML｜invoke>"),
]  # fmt: skip
