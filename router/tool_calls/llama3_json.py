"""Llama 3.1-3.3 JSON tool calling (llama3_json; llama4_json is vLLM's other name for it):
the answer is the call itself,

    {"name": "get_weather", "parameters": {"city": "Paris"}}

("arguments" is taken for "parameters" too), maybe after `<|python_tag|>`, several calls joined
by "; ". Only an answer that starts with `{` (after whitespace and the tag) is read for calls;
any other answer is content as a whole. Text after the calls is content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from router.tool_calls.common import (
    Piece,
    ScanParser,
    call_from_object,
    calls_rules,
    decode_at,
    json_term,
    lark,
    literal,
    name_literal,
    skip_spaces,
)
from router.tool_calls.types import MarkerTerm, Tool

TAG = "<|python_tag|>"
_ARGUMENT_KEYS = ("parameters", "arguments")


class Llama3JsonParser(ScanParser):
    name: ClassVar[str] = "llama3_json"
    markers: ClassVar[tuple[str, ...]] = (TAG,)

    def scan(self, text: str, at_start: bool, final: bool) -> tuple[list[Piece], int]:
        if not at_start:
            return [text], len(text)  # the start said content: the rest is content too
        brace = _first_brace(text)
        if brace is None:
            # Not (yet) a call; a beginning that may still become one waits.
            if not final and _may_start(text):
                return [], 0
            return [text], len(text)
        if not final:
            return [], 0  # a call has no end marker: it is whole only when the answer is
        return _calls(text, brace) or [text], len(text)

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        head, middle, tail = literal('{"name": '), literal(', "parameters": '), literal("}")

        def call(tool: Tool) -> str:
            return f"{head} {name_literal(tool.name)} {middle} {json_term(tool.parameters)} {tail}"

        return lark(calls_rules(tools, call, parallel, separator=literal("; ")))


class Llama4JsonParser(Llama3JsonParser):
    """vLLM's other name for Llama 3's JSON calls, for Llama 4 models prompted that way."""

    name: ClassVar[str] = "llama4_json"


def _after_tag(text: str) -> int:
    pos = skip_spaces(text, 0)
    if text.startswith(TAG, pos):
        pos = skip_spaces(text, pos + len(TAG))
    return pos


def _first_brace(text: str) -> int | None:
    pos = _after_tag(text)
    return pos if text.startswith("{", pos) else None


def _may_start(text: str) -> bool:
    """Whitespace, the tag or a piece of it: what comes next decides."""
    rest = text[skip_spaces(text, 0) :]
    return TAG.startswith(rest) or _after_tag(text) == len(text)


def _calls(text: str, pos: int) -> list[Piece]:
    """The calls from `text[pos]` on, then the text after the last one; [] where the first is
    not a call."""
    pieces: list[Piece] = []
    while True:
        decoded = decode_at(text, pos)
        call = call_from_object(decoded[0], _ARGUMENT_KEYS) if decoded else None
        if call is None:
            break
        pieces.append(call)
        pos = skip_spaces(text, decoded[1])
        if text.startswith(";", pos):
            pos = skip_spaces(text, pos + 1)
    if not pieces:
        return []
    return [*pieces, text[pos:]]
