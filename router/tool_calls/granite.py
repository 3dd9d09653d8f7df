"""IBM Granite 3.x calls (granite): the answer is a JSON list of calls, after `<|tool_call|>`
(Granite 3.0's token) or `<tool_call>` (3.1's text), or both, or neither,

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]

Only an answer that starts (after whitespace and the markers) with `[{` is read for calls; any
other answer is content as a whole, and so is a list that is not calls (every item one). Text
after the list is content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from router.tool_calls.common import (
    Piece,
    ScanParser,
    calls_from_list,
    calls_rules,
    decode_at,
    json_term,
    lark,
    literal,
    name_literal,
    skip_spaces,
)
from router.tool_calls.types import MarkerTerm, Tool

TOKEN = "<|tool_call|>"
TAG = "<tool_call>"


class GraniteParser(ScanParser):
    name: ClassVar[str] = "granite"
    markers: ClassVar[tuple[str, ...]] = (TOKEN,)

    def scan(self, text: str, at_start: bool, final: bool) -> tuple[list[Piece], int]:
        if not at_start:
            return [text], len(text)  # the start said content: the rest is content too
        pos, waiting = _after_markers(text)
        if waiting and not final:
            return [], 0  # whitespace or a piece of a marker: what comes next decides
        if not text.startswith("[", pos):
            return [text], len(text)
        first = skip_spaces(text, pos + 1)
        if first == len(text) and not final:
            return [], 0
        if not text.startswith("{", first):
            return [text], len(text)  # a list, but not of call objects
        decoded = decode_at(text, pos)
        if decoded is None:
            if not final:
                return [], 0  # the list has no end marker: it may still close
            return [text], len(text)
        calls = calls_from_list(decoded[0])
        if calls is None:
            return [text], len(text)
        return [*calls, text[decoded[1] :]], len(text)

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        head, middle, tail = literal('{"name": '), literal(', "arguments": '), literal("}")

        def call(tool: Tool) -> str:
            return f"{head} {name_literal(tool.name)} {middle} {json_term(tool.parameters)} {tail}"

        around = (f"{marker(TOKEN)} {literal('[')}", literal("]"))
        return lark(calls_rules(tools, call, parallel, literal(", "), around))


def _after_markers(text: str) -> tuple[int, bool]:
    """Where the list may start (past whitespace and the markers, in their order), and whether
    the text ends before anything else showed (whitespace or a piece of a marker)."""
    pos = skip_spaces(text, 0)
    for marker in (TOKEN, TAG):
        if text.startswith(marker, pos):
            pos = skip_spaces(text, pos + len(marker))
        elif marker.startswith(text[pos:]):
            return pos, True  # nothing more yet, or a piece of this marker
    return pos, pos == len(text)
