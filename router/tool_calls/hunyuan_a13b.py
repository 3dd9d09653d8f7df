"""Hunyuan-A13B's calls (hunyuan_a13b): a JSON list of calls in one block,

    <tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>

Hermes' layout otherwise (router/tool_calls/hermes.py): text before, between or after blocks
is content; a block that never closes, or whose body is not a list of calls (every item one),
stays content as written. An item's `arguments` may be the JSON text of an object instead of
the object (vLLM passes such text on). vLLM also skips a block that lies inside
`<think>...</think>`; here reasoning is split off before calls are read (`--reasoning-parser`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from router.tool_calls.common import (
    calls_from_list,
    calls_rules,
    json_term,
    lark,
    literal,
    load_json,
    name_literal,
)
from router.tool_calls.hermes import HermesParser
from router.tool_calls.types import MarkerTerm, Tool, ToolCall

OPEN = "<tool_calls>"
CLOSE = "</tool_calls>"


class HunyuanA13BParser(HermesParser):
    name: ClassVar[str] = "hunyuan_a13b"
    markers: ClassVar[tuple[str, ...]] = (OPEN, CLOSE)
    block_open: ClassVar[str] = OPEN
    block_close: ClassVar[str] = CLOSE

    def read_block(self, body: str) -> list[ToolCall] | None:
        found = load_json(body)
        if isinstance(found, list):
            found = [_arguments_as_object(item) for item in found]
        return calls_from_list(found)

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        head, middle, tail = literal('{"name": '), literal(', "arguments": '), literal("}")

        def call(tool: Tool) -> str:
            return f"{head} {name_literal(tool.name)} {middle} {json_term(tool.parameters)} {tail}"

        around = (f"{marker(OPEN)} {literal('[')}", f"{literal(']')} {marker(CLOSE)}")
        return lark(calls_rules(tools, call, parallel, literal(", "), around))


def _arguments_as_object(item: Any) -> Any:
    """A call whose `arguments` is an object's JSON text, with the object in its place."""
    if isinstance(item, dict) and isinstance(item.get("arguments"), str):
        decoded = load_json(item["arguments"])
        if isinstance(decoded, dict):
            return {**item, "arguments": decoded}
    return item
