"""Hermes-style calls (Qwen2.5, Qwen3, Hermes 2/3): each call a block

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

with free whitespace around the JSON; several blocks may follow each other, and text before,
between or after them is content. A block that is not closed, or whose JSON is not a call, stays
content as written. An argument may hold `</tool_call>` itself (a model writing about tool
calls, or code that does): a block ends at the first closer after which its JSON is a call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from router.tool_calls.common import (
    Piece,
    ScanParser,
    call_from_object,
    calls_rules,
    json_term,
    lark,
    literal,
    load_json,
    name_literal,
    occurrences,
    partial_marker,
)
from router.tool_calls.types import MarkerTerm, Tool, ToolCall

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class HermesParser(ScanParser):
    name: ClassVar[str] = "hermes"
    # `<tool_call>` is an added token that is not special in Qwen's tokenizers: its text is
    # already in the answer's text.
    markers: ClassVar[tuple[str, ...]] = ()
    # A block's markers; a subclass with the same layout but other markers or bodies (Hunyuan's
    # lists of calls) gives its own, and its `read_block`.
    block_open: ClassVar[str] = OPEN
    block_close: ClassVar[str] = CLOSE

    def read_block(self, body: str) -> list[ToolCall] | None:
        """The calls a block's body holds, None where it is not calls."""
        call = call_from_object(load_json(body))
        return [call] if call is not None else None

    def scan(self, text: str, at_start: bool, final: bool) -> tuple[list[Piece], int]:
        pieces: list[Piece] = []
        pos = 0
        while True:
            start = text.find(self.block_open, pos)
            if start < 0:
                # No block opens: all is content but a tail that may be the start of one.
                end = (
                    len(text)
                    if final
                    else len(text) - partial_marker(text[pos:], (self.block_open,))
                )
                pieces.append(text[pos:end])
                return pieces, end
            pieces.append(text[pos:start])
            body = start + len(self.block_open)
            closes = occurrences(text, self.block_close, body)
            for close in closes:
                calls = self.read_block(text[body:close])
                if calls is not None:
                    pos = close + len(self.block_close)
                    pieces += calls
                    break
            else:
                if not final and (not closes or _in_json_string(text, body, closes[0])):
                    return pieces, start  # the block may still close
                if not closes:
                    pieces.append(text[start:])  # never closed: content
                    return pieces, len(text)
                pos = closes[0] + len(self.block_close)  # not a call: content to its first closer
                pieces.append(text[start:pos])

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        # Each block as Qwen's chat template shows a call: the JSON on a line of its own.
        head, middle, tail = literal('\n{"name": '), literal(', "arguments": '), literal("}\n")

        def call(tool: Tool) -> str:
            return (
                f"{marker(OPEN)} {head} {name_literal(tool.name)} {middle} "
                f"{json_term(tool.parameters)} {tail} {marker(CLOSE)}"
            )

        return lark(calls_rules(tools, call, parallel, separator=literal("\n")))


class Ernie45Parser(HermesParser):
    """ERNIE 4.5's calls are Hermes' blocks; vLLM names its parser ernie45."""

    name: ClassVar[str] = "ernie45"


def _in_json_string(text: str, begin: int, at: int) -> bool:
    """Whether position `at` lies inside a JSON string literal of the JSON starting at begin
    (a closer there is part of an argument whose string has not ended yet)."""
    inside = escaped = False
    for char in text[begin:at]:
        if escaped:
            escaped = False
        elif char == "\\" and inside:
            escaped = True
        elif char == '"':
            inside = not inside
    return inside
