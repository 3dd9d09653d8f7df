"""Mistral's calls: `[TOOL_CALLS]` then either

- a JSON list of calls (the v3 tokenizers: Mistral 7B v0.3, Mixtral 8x22B, Nemo):
  `[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]`, or
- one call as name, `[ARGS]` and the arguments' JSON (the v11+ tokenizers: Mistral Small 3.2,
  Magistral, Devstral): `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}`, the marker again before
  each further call.

Text before the first `[TOOL_CALLS]` is content; so is text after a call. A marker not followed
by a well-formed call stays content, up to the next marker.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from router.tool_calls.common import (
    Piece,
    ScanParser,
    call_from_object,
    calls_rules,
    decode_at,
    dump_arguments,
    json_term,
    lark,
    literal,
    name_literal,
    partial_marker,
    skip_spaces,
)
from router.tool_calls.types import MarkerTerm, Tool, ToolCall

CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
# A name of the `[ARGS]` form: no spaces or brackets (so no marker runs into it).
_NAME = re.compile(r"[^\s\[\]{}]+")


class MistralParser(ScanParser):
    name: ClassVar[str] = "mistral"
    markers: ClassVar[tuple[str, ...]] = (CALLS, ARGS)

    def scan(self, text: str, at_start: bool, final: bool) -> tuple[list[Piece], int]:
        first = text.find(CALLS)
        if first < 0:
            end = len(text) if final else len(text) - partial_marker(text, (CALLS,))
            return [text[:end]], end
        if not final:
            # The calls have no end marker: they are whole only when the answer is.
            return [text[:first]], first
        pieces: list[Piece] = [text[:first]]
        pos = first
        while pos >= 0:
            calls, end = _calls(text, pos + len(CALLS))
            following = text.find(CALLS, end)
            stop = following if following >= 0 else len(text)
            # A marker without a well-formed call is content, up to the next marker.
            pieces += [*calls, text[end:stop]] if calls else [text[pos:stop]]
            pos = following
        return pieces, len(text)

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        if marker(ARGS).startswith("<["):
            # A tokenizer with an `[ARGS]` token is the newer one, whose models write that form.
            def named(tool: Tool) -> str:
                return (
                    f"{marker(CALLS)} {literal(tool.name)} {marker(ARGS)} "
                    f"{json_term(tool.parameters)}"
                )

            return lark(calls_rules(tools, named, parallel))
        head, middle, tail = literal('{"name": '), literal(', "arguments": '), literal("}")

        def listed(tool: Tool) -> str:
            return f"{head} {name_literal(tool.name)} {middle} {json_term(tool.parameters)} {tail}"

        around = (f"{marker(CALLS)} {literal('[')}", literal("]"))
        return lark(calls_rules(tools, listed, parallel, literal(", "), around))


def _calls(text: str, pos: int) -> tuple[list[ToolCall], int]:
    """The calls right after a marker that ends at `pos`, and where they end; [] where the
    marker is not followed by a call."""
    start = skip_spaces(text, pos)
    if text.startswith("[", start):
        decoded = decode_at(text, start)
        if decoded is None or not isinstance(decoded[0], list) or not decoded[0]:
            return [], pos
        found = [call_from_object(item) for item in decoded[0]]
        calls = [call for call in found if call is not None]
        return (calls, decoded[1]) if len(calls) == len(found) else ([], pos)
    args = text.find(ARGS, pos)
    name = text[pos:args].strip() if args >= 0 else ""
    if not _NAME.fullmatch(name):
        return [], pos
    decoded = decode_at(text, skip_spaces(text, args + len(ARGS)))
    if decoded is None or not isinstance(decoded[0], dict):
        return [], pos
    return [ToolCall(name, dump_arguments(decoded[0]))], decoded[1]
