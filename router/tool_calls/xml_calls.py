"""The XML call formats: a block of calls, each a function name and its arguments written one
parameter per tag pair, values as text (router/tool_calls/xml_values.py reads them back).

    <tool_call>                           Qwen3-Coder, Qwen3.5 (qwen3_coder); Seed-OSS the same
    <function=get_weather>                in <seed:tool_call>; MiniMax-M2 writes
    <parameter=city>                      <invoke name="…"> and <parameter name="…">, several
    Paris                                 calls to a block; GLM-4.5 writes the name right after
    </parameter>                          the block's tag, then <arg_key>…</arg_key>
    </function>                           <arg_value>…</arg_value> pairs
    </tool_call>

A format is an `XmlFormat`; one scanner reads them all. Text around blocks is content. A value
may hold the format's own tags (code that writes XML): a value ends at the first closing tag
that is followed by the next parameter or the end of its call, and a block at the first closer
after which its body reads as calls. A block that never closes, or whose body is not calls, is
content as written; while it may still close, a stream holds it back.

An enforced `tool_choice` writes the calls as the family's template shows them, each parameter
of the tool's schema in order (required ones always, others optionally), strings as free text
up to their closing tag and everything else as JSON under the parameter's schema.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from router.tool_calls.common import (
    Piece,
    ScanParser,
    calls_rules,
    dump_arguments,
    json_term,
    lark,
    literal,
    occurrences,
    partial_marker,
    skip_spaces,
)
from router.tool_calls.types import MarkerTerm, Tool, ToolCall
from router.tool_calls.xml_values import Kind, argument_value, json_value, resolved, value_kind


@dataclass(frozen=True)
class XmlFormat:
    block_open: str
    block_close: str
    call_head: re.Pattern[str]  # group `name`
    # What closes a call; None: the call runs to the block's end (one call per block).
    call_close: str | None
    param_head: re.Pattern[str]  # group `key`; the value starts where it ends
    param_close: str
    # The templates that put values on lines of their own: a newline at either end of a value
    # is the layout's, not the value's.
    values_on_lines: bool = True


@dataclass(frozen=True)
class XmlLayout:
    """How the family's template writes calls, for the grammar: the text before and after a
    call's parameters (given the name), before a value (given the key), the text that ends a
    value (a stop string, or where it is a token of the vocabulary the token alone after any
    newline the value keeps), and what joins calls and wraps them."""

    call_open: Callable[[str], str]
    call_end: str  # after the parameters, before the next call or the block's closer
    # Given the key and how the value is written ("string": as text, "json").
    param_open: Callable[[str, Kind], str]
    value_end: str  # the text that ends a value (its closing tag with what the layout puts before)
    param_end: str  # after the closing tag
    # One block per call (joined by `separator`), or all calls in one block.
    block_per_call: bool = True
    separator: str = ""
    block_head: str = ""  # after the block's opening tag (before the first call)


class XmlCallParser(ScanParser):
    """A format's scanner; `for_tools` gives the copy that reads values by the tools' schemas."""

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]] = ()
    format: ClassVar[XmlFormat]
    layout: ClassVar[XmlLayout]

    def __init__(self, schemas: dict[str, dict[str, Any]] | None = None) -> None:
        self._schemas = schemas or {}

    def for_tools(self, tools: Sequence[Tool]) -> XmlCallParser:
        return type(self)({tool.name: tool.parameters for tool in tools})

    def scan(self, text: str, at_start: bool, final: bool) -> tuple[list[Piece], int]:
        fmt = self.format
        pieces: list[Piece] = []
        pos = 0
        while True:
            start = text.find(fmt.block_open, pos)
            if start < 0:
                held = 0 if final else partial_marker(text[pos:], (fmt.block_open,))
                pieces.append(text[pos : len(text) - held])
                return pieces, len(text) - held
            pieces.append(text[pos:start])
            body = start + len(fmt.block_open)
            closes = occurrences(text, fmt.block_close, body)
            for close in closes:
                calls = self._calls(text[body:close])
                if calls:
                    pieces += calls
                    pos = close + len(fmt.block_close)
                    break
            else:
                if not final:
                    return pieces, start  # a later closer may still make it calls
                if not closes:
                    pieces.append(text[start:])  # never closed: content
                    return pieces, len(text)
                pos = closes[0] + len(fmt.block_close)  # not calls: content to its first closer
                pieces.append(text[start:pos])

    def _calls(self, body: str) -> list[ToolCall] | None:
        """The calls a block's body holds; None where it is not (only) calls."""
        fmt = self.format
        calls: list[ToolCall] = []
        pos = 0
        while True:
            head = fmt.call_head.match(body, skip_spaces(body, pos))
            if head is None:
                break
            name = head.group("name").strip()
            read = self._arguments(body, head.end(), name)
            if read is None:
                return None
            arguments, pos = read
            if fmt.call_close is not None:
                pos = skip_spaces(body, pos)
                if not body.startswith(fmt.call_close, pos):
                    return None
                pos += len(fmt.call_close)
            calls.append(ToolCall(name, dump_arguments(arguments)))
            if fmt.call_close is None:
                break
        if not calls or body[pos:].strip():
            return None
        return calls

    def _arguments(self, body: str, pos: int, name: str) -> tuple[dict[str, Any], int] | None:
        fmt = self.format
        schema = self._schemas.get(name) or {}
        properties = schema.get("properties") if isinstance(schema, dict) else None
        properties = properties if isinstance(properties, dict) else {}
        arguments: dict[str, Any] = {}
        while True:
            head = fmt.param_head.match(body, skip_spaces(body, pos))
            if head is None:
                return arguments, pos
            end = self._value_end(body, head.end())
            if end is None:
                return None
            key = head.group("key").strip()
            value = body[head.end() : end]
            if fmt.values_on_lines:
                value = _one_newline_off(value)
            written = head.groupdict().get("string")  # DSML says how it wrote the value
            if written == "true":
                arguments[key] = value
            elif written == "false":
                arguments[key] = json_value(value)
            else:
                arguments[key] = argument_value(value, resolved(properties.get(key), schema))
            pos = end + len(fmt.param_close)

    def _value_end(self, body: str, begin: int) -> int | None:
        """The closing tag that ends a value: the first one followed by another parameter, the
        call's end, or the body's."""
        fmt = self.format
        for at in occurrences(body, fmt.param_close, begin):
            after = skip_spaces(body, at + len(fmt.param_close))
            if after == len(body) or fmt.param_head.match(body, after):
                return at
            if fmt.call_close is not None and body.startswith(fmt.call_close, after):
                return at
        return None

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        fmt, layout = self.format, self.layout
        terms = _Terms(marker, (*self.markers, fmt.block_open, fmt.block_close))
        values: list[str] = []  # the rules of free-text values

        def call(tool: Tool) -> str:
            parts = [terms(layout.call_open(tool.name))]
            parts += _parameter_terms(tool, layout, terms, values)
            parts.append(terms(layout.call_end))
            if layout.block_per_call:
                parts = [marker(fmt.block_open), *parts, marker(fmt.block_close)]
            return " ".join(p for p in parts if p)

        if layout.block_per_call:
            rules = calls_rules(tools, call, parallel, separator=terms(layout.separator))
        else:
            head = f"{marker(fmt.block_open)} {terms(layout.block_head)}".strip()
            rules = calls_rules(tools, call, parallel, around=(head, marker(fmt.block_close)))
        return lark(rules + values)


class _Terms:
    """Layout text as Lark terms: each marker in it by `marker` (its token where the vocabulary
    has it as one, which a quoted literal could not match), the rest quoted."""

    def __init__(self, marker: MarkerTerm, markers: Sequence[str]) -> None:
        self.marker = marker
        ordered = sorted(set(markers), key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, ordered)) + ")")

    def __call__(self, text: str) -> str:
        parts = [p for p in self._split.split(text) if p]
        return " ".join(self.marker(p) if self._split.fullmatch(p) else literal(p) for p in parts)

    def is_token(self, text: str) -> bool:
        return self.marker(text).startswith("<[")


def _parameter_terms(tool: Tool, layout: XmlLayout, terms: _Terms, values: list[str]) -> list[str]:
    """The terms of a call's parameters, in the schema's order; free-text value rules are
    added to `values`."""
    schema = tool.parameters if isinstance(tool.parameters, dict) else {}
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        if schema.get("additionalProperties", True) is False or "properties" in schema:
            return []  # no parameters
        # Any object: parameters of any name, each a string.
        free = _free_text(layout, terms, values, {})
        key = "/[A-Za-z_][A-Za-z0-9_.\\-]*/"
        before, after = layout.param_open("\0", "string").split("\0")
        return [f"({terms(before)} {key} {terms(after)} {free} {terms(layout.param_end)})*"]
    required = set(schema.get("required") or [])
    # References into the schema's definitions still resolve from a property's own schema.
    definitions = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    parts = []
    for key, sub in properties.items():
        sub = resolved(sub, schema)
        if isinstance(sub, dict) and definitions:
            sub = {**sub, **definitions}
        value = _value_term(key, sub, tool, layout, terms, values)
        opener = terms(layout.param_open(key, value_kind(sub)))
        term = f"{opener} {value} {terms(layout.param_end)}".strip()
        parts.append(term if key in required else f"({term})?")
    return parts


def _value_term(
    key: str, schema: Any, tool: Tool, layout: XmlLayout, terms: _Terms, values: list[str]
) -> str:
    if value_kind(schema) == "json":
        return f"{json_term(schema, default={})} {terms(layout.value_end)}"
    schema = schema if isinstance(schema, dict) else {}
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if choices is not None:
        options = " | ".join(literal(c) for c in choices)
        return f"({options}) {terms(layout.value_end)}"
    for word in ("pattern", "format"):
        if word in schema:
            raise ValueError(
                f"{tool.name}: parameter {key!r}: a string's `{word}` cannot be enforced in "
                "this format; drop it from the schema or use tool_choice auto"
            )
    return _free_text(layout, terms, values, schema)


def _free_text(layout: XmlLayout, terms: _Terms, values: list[str], schema: dict) -> str:
    """Text up to the value's closing tag (which it cannot hold), within the schema's length.
    A newline the layout puts before the tag may be the text's last character (parsing takes
    it off)."""
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    tag = layout.value_end.lstrip("\n")
    if high is not None or terms.is_token(tag):
        # Bounded text, or text a token ends: a regex that cannot run into the tag, so the
        # tag's first character (or token) ends it. (A stop string, below, is not offered
        # once a bounded text is full: the model could then only stop.)
        lead = layout.value_end[: len(layout.value_end) - len(tag)]
        top = "" if high is None else int(high)
        chars = "(?s:.)" if terms.is_token(tag) else "[^<]"
        return f"/{chars}{{{low},{top}}}{_optional(lead)}/ {terms(tag)}"
    rule = f"value_{len(values)}"
    values.append(f"{rule}[stop={literal(layout.value_end)}]: /(?s:.{{{low},}})/")
    return rule


def _optional(text: str) -> str:
    """`text` (newlines) as an optional group of a Lark regex, nothing for none."""
    return f"(?:{text.replace(chr(10), chr(92) + 'n')})?" if text else ""


def _one_newline_off(value: str) -> str:
    """A value without the newline its template writes at each end (Qwen3-Coder puts values on
    lines of their own); other whitespace is the value's."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value
