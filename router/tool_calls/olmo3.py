"""Olmo 3's calls (olmo3): pythonic calls, one a line, in a `<function_calls>` block,

    <function_calls>
    get_weather(city="Paris", unit="c")
    get_time(zone=null)
    </function_calls>

each call as `pythonic` reads one (keyword arguments, literals; JSON's true, false and null
too). Text before and after a block is content. A block ends at the first closer outside a
string of its calls; one that never closes, or whose lines are not all calls, stays content as
written. An answer that is only such lines, without the block, is read as calls too (vLLM does
so for a whole answer); it must start with `name(` for the stream to hold it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from router.tool_calls.common import (
    Piece,
    ScanParser,
    lark,
    literal,
    occurrences,
    partial_marker,
    skip_spaces,
)
from router.tool_calls.pythonic import pythonic_rules, read_calls
from router.tool_calls.types import MarkerTerm, Tool, ToolCall

OPEN = "<function_calls>"
CLOSE = "</function_calls>"
# The head of a bare call, and what may still grow into one.
_HEAD = re.compile(r"[^\W\d]\w*\s*\(")
_HEAD_SO_FAR = re.compile(r"[^\W\d]\w*\s*\Z")


class Olmo3Parser(ScanParser):
    name: ClassVar[str] = "olmo3"
    markers: ClassVar[tuple[str, ...]] = (OPEN, CLOSE)

    def scan(self, text: str, at_start: bool, final: bool) -> tuple[list[Piece], int]:
        if at_start:
            pos = skip_spaces(text, 0)
            if _HEAD.match(text, pos):
                if not final:
                    return [], 0  # no end marker: the calls are whole at the answer's end
                calls = _read_lines(text)
                if calls is not None:
                    return list(calls), len(text)
            elif not final and (pos == len(text) or _HEAD_SO_FAR.match(text, pos)):
                return [], 0
        return self._blocks(text, final)

    def _blocks(self, text: str, final: bool) -> tuple[list[Piece], int]:
        pieces: list[Piece] = []
        pos = 0
        while True:
            start = text.find(OPEN, pos)
            if start < 0:
                end = len(text) if final else len(text) - partial_marker(text[pos:], (OPEN,))
                pieces.append(text[pos:end])
                return pieces, end
            pieces.append(text[pos:start])
            body = start + len(OPEN)
            close = next(
                (at for at in occurrences(text, CLOSE, body) if not _in_string(text[body:at])),
                None,
            )
            if close is None:
                if not final:
                    return pieces, start  # the block may still close
                pieces.append(text[start:])  # never closed: content
                return pieces, len(text)
            pos = close + len(CLOSE)
            calls = _read_lines(text[body:close])
            pieces += calls if calls is not None else [text[start:pos]]

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        newline = literal("\n")
        around = (f"{marker(OPEN)} {newline}", f"{newline} {marker(CLOSE)}")
        return lark(pythonic_rules(tools, parallel, newline, around))


def _read_lines(text: str) -> list[ToolCall] | None:
    """The calls of `text`, one a line (blank lines aside), None where a line is not one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return read_calls("[" + ", ".join(lines) + "]") if lines else None


def _in_string(text: str) -> bool:
    """Whether `text` ends inside a Python string literal (a closer there is an argument's)."""
    quote = None
    escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif quote is not None and char == "\\":
            escaped = True
        elif quote is None and char in "'\"":
            quote = char
        elif char == quote:
            quote = None
    return quote is not None
