"""Phi-4-mini's calls (phi4_mini_json): `functools` and a JSON list of calls,

    functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]

("parameters" is taken for "arguments" too). The list may come anywhere in the answer: text
before and after it is content, and so is a `functools[` not followed by a list of calls (up to
the next one where the list never closes). `functools` is text, not a special token.
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
    partial_marker,
    skip_spaces,
)
from router.tool_calls.types import MarkerTerm, Tool

MARKER = "functools["
_ARGUMENT_KEYS = ("arguments", "parameters")


class Phi4MiniJsonParser(ScanParser):
    name: ClassVar[str] = "phi4_mini_json"
    markers: ClassVar[tuple[str, ...]] = ()

    def scan(self, text: str, at_start: bool, final: bool) -> tuple[list[Piece], int]:
        pieces: list[Piece] = []
        pos = 0
        while True:
            start = text.find(MARKER, pos)
            if start < 0:
                end = len(text) if final else len(text) - partial_marker(text[pos:], (MARKER,))
                pieces.append(text[pos:end])
                return pieces, end
            pieces.append(text[pos:start])
            bracket = start + len(MARKER) - 1
            first = skip_spaces(text, bracket + 1)
            if first == len(text) and not final:
                return pieces, start
            if not text.startswith("{", first):
                pieces.append(text[start : bracket + 1])  # not a list of call objects
                pos = bracket + 1
                continue
            decoded = decode_at(text, bracket)
            if decoded is None:
                if not final:
                    return pieces, start  # the list may still close
                following = text.find(MARKER, bracket)
                pos = following if following >= 0 else len(text)
                pieces.append(text[start:pos])
                continue
            calls = calls_from_list(decoded[0], _ARGUMENT_KEYS)
            pos = decoded[1]
            pieces += calls if calls is not None else [text[start:pos]]

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        head, middle, tail = literal('{"name": '), literal(', "arguments": '), literal("}")

        def call(tool: Tool) -> str:
            return f"{head} {name_literal(tool.name)} {middle} {json_term(tool.parameters)} {tail}"

        around = (literal(MARKER), literal("]"))
        return lark(calls_rules(tools, call, parallel, literal(", "), around))
