"""The minimax_m2 parser: `<invoke>` calls, several to a `<minimax:tool_call>` block."""

from __future__ import annotations

from router.tool_calls.minimax_m2 import MiniMaxM2Parser
from router.tool_calls.types import Parsed, Tool, ToolCall

SEARCH = {"type": "object", "properties": {"query": {"type": "string"},
          "limit": {"type": "integer"}, "exact": {"type": "boolean"}}}  # fmt: skip
PARSER = MiniMaxM2Parser().for_tools([Tool("search", None, SEARCH)])
TWO = (
    '<minimax:tool_call>\n<invoke name="search">\n<parameter name="query">AI news</parameter>\n'
    '<parameter name="limit">10</parameter>\n</invoke>\n<invoke name="search">\n'
    '<parameter name="query">42</parameter>\n<parameter name="exact">false</parameter>\n'
    "</invoke>\n</minimax:tool_call>"
)
WHOLE = [
    ("Hello.", Parsed("Hello.", [])),
    (
        "Searching.\n" + TWO + "\nDone.",
        Parsed("Searching.\n\nDone.", [ToolCall("search", '{"query": "AI news", "limit": 10}'),
                                       ToolCall("search", '{"query": "42", "exact": false}')]),
    ),
    (
        '<minimax:tool_call><invoke name="now"></invoke></minimax:tool_call>',
        Parsed(None, [ToolCall("now", "{}")]),
    ),
]  # fmt: skip

MALFORMED = [
    '<minimax:tool_call>\n<invoke name="search">\n<parameter name="query">x</parameter>\n'
    "</minimax:tool_call>",  # no </invoke>
    '<minimax:tool_call>\n<invoke name="search">\n<parameter name="query">x</parameter>\nBROKEN\n'
    "</invoke>\n</minimax:tool_call>",
    TWO.removesuffix("</minimax:tool_call>"),
    "<minimax:tool_call>\n</minimax:tool_call>",  # no call
]
