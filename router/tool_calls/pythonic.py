"""Pythonic calls (Llama 3.2, Llama 4): the answer is a Python list of calls,

    [get_weather(city="Paris", unit="c"), get_time(zone=None)]

keyword arguments only, each a literal: strings, numbers, True/False/None (JSON's true, false and
null too), and lists, tuples and dicts of them. Llama 4 may wrap it in `<|python_start|>` and
`<|python_end|>`; text after the list is content. Read with `ast`, never evaluated. Only an answer
that starts (after whitespace and the start tag) as `[name(` is read for calls; any other
answer, or a list that is not all calls of that kind, is content as a whole.
"""

from __future__ import annotations

import ast
import itertools
import math
import re
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

from router.tool_calls.common import (
    Piece,
    ScanParser,
    calls_rules,
    dump_arguments,
    json_term,
    lark,
    literal,
    load_json,
    skip_spaces,
)
from router.tool_calls.types import MarkerTerm, Tool, ToolCall

START = "<|python_start|>"
END = "<|python_end|>"
# The head of a list of calls, and what may still grow into one.
_HEAD = re.compile(r"\[\s*[^\W\d]\w*\s*\(")
_HEAD_SO_FAR = re.compile(r"\[\s*(?:[^\W\d]\w*\s*)?\Z")
_IDENTIFIER = re.compile(r"[^\W\d]\w*")
_ANY_KEYWORD = "/[A-Za-z_][A-Za-z0-9_]*/"  # what a grammar writes: ASCII identifiers
# A list followed by text is found by trying shorter lists, each ending at a `]`: so many at most.
_TRIES = 64
_JSON_NAMES = {"true": True, "false": False, "null": None}


class PythonicParser(ScanParser):
    name: ClassVar[str] = "pythonic"
    markers: ClassVar[tuple[str, ...]] = (START, END)

    def scan(self, text: str, at_start: bool, final: bool) -> tuple[list[Piece], int]:
        if not at_start:
            return [text], len(text)  # the start said content: the rest is content too
        pos = skip_spaces(text, 0)
        if not final and len(text) - pos < len(START) and START.startswith(text[pos:]):
            return [], 0  # nothing yet, or a piece of the start tag
        if text.startswith(START, pos):
            pos = skip_spaces(text, pos + len(START))
        if _HEAD.match(text, pos):
            if not final:
                return [], 0  # the end tag is optional: the list is whole at the answer's end
            return _calls(text, pos) or [text], len(text)
        if not final and (pos == len(text) or _HEAD_SO_FAR.match(text, pos)):
            return [], 0
        return [text], len(text)

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        return lark(pythonic_rules(tools, parallel, literal(", "), (literal("["), literal("]"))))


class Llama4PythonicParser(PythonicParser):
    """Llama 4's pythonic calls, maybe between `<|python_start|>` and `<|python_end|>` (which
    `pythonic` reads too); vLLM names its parser llama4_pythonic."""

    name: ClassVar[str] = "llama4_pythonic"


def pythonic_rules(
    tools: Sequence[Tool], parallel: bool, separator: str, around: tuple[str, str]
) -> list[str]:
    """`calls_rules` for calls written `name(keyword=value, ...)`, each value a `%json` of its
    property's schema (JSON's literals are read back as Python's)."""
    rules: list[str] = []
    numbers = itertools.count()

    def call(tool: Tool) -> str:
        if not tool.name.isidentifier():  # the parser could not read the call back
            raise ValueError(
                f"pythonic calls name a function by a Python identifier: {tool.name!r}"
            )
        head = f"args_{next(numbers)}"
        rules.extend(_argument_rules(head, tool.parameters))
        return f"{literal(tool.name + '(')} {head} {literal(')')}"

    return calls_rules(tools, call, parallel, separator, around) + rules


def _calls(text: str, pos: int) -> list[Piece]:
    """The calls of the list at `text[pos]`, then the text after it; [] where that is not a
    list of calls. The list ends at the end tag, else at the last `]` that closes one."""
    end = text.find(END, pos)
    region_end = end if end >= 0 else len(text)
    after = end + len(END) if end >= 0 else len(text)
    close = region_end
    for _ in range(_TRIES):
        if close <= pos:
            break
        calls = read_calls(text[pos:close].rstrip())
        if calls is not None:
            return [*calls, text[close:region_end] + text[after:]]
        close = text.rfind("]", pos, close - 1) + 1  # a shorter list, for text after it
    return []


def read_calls(source: str) -> list[ToolCall] | None:
    """The calls of `source` when it is a Python list of calls with literal keyword arguments
    only, else None."""
    try:
        with warnings.catch_warnings():
            # The model's text may hold escapes Python frowns on (`\/`): not the log's business.
            warnings.simplefilter("ignore")
            tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        arguments = {}
        for keyword in node.keywords:
            # **spread, or a keyword twice (which only compiling, not parsing, refuses)
            if keyword.arg is None or keyword.arg in arguments:
                return None
            try:
                arguments[keyword.arg] = _value(keyword.value, source)
            except ValueError:
                return None
        calls.append(ToolCall(node.func.id, dump_arguments(arguments)))
    return calls


def _value(node: ast.expr, source: str) -> Any:
    """The literal `node` as a JSON value; ValueError for anything else."""
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, str):
            return _string(node, source)
        if value is None or isinstance(value, (bool, int)) or _finite(value):
            return value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = node.operand
        if isinstance(operand, ast.Constant) and not isinstance(operand.value, bool):
            if isinstance(operand.value, int) or _finite(operand.value):
                return -operand.value if isinstance(node.op, ast.USub) else operand.value
    elif isinstance(node, (ast.List, ast.Tuple)):
        return [_value(item, source) for item in node.elts]
    elif isinstance(node, ast.Dict):
        result = {}
        for key, item in zip(node.keys, node.values, strict=True):
            if key is None:  # **spread
                raise ValueError("not a literal")
            name = _value(key, source)
            if not isinstance(name, str):
                raise ValueError("a JSON object's keys are strings")
            result[name] = _value(item, source)
        return result
    elif isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise ValueError("not a literal")


def _finite(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def _string(node: ast.Constant, source: str) -> str:
    """A string literal's value. A double-quoted one that is also a JSON string is read as JSON
    (what the grammar writes): the two differ on `\\/`, which Python keeps as two characters."""
    written = ast.get_source_segment(source, node)
    if written and written.startswith('"') and not written.startswith('"""'):
        value = load_json(written)
        if isinstance(value, str):
            return value
    return node.value


def _argument_rules(head: str, schema: dict[str, Any]) -> list[str]:
    """Rules for a call's keyword arguments: the schema's properties in its order, each
    required one always there and each other one optional, every value a `%json` of its own
    schema. Only what is written in `properties` and `required` is enforced: a schema that
    allows more (`additionalProperties`) gets its declared properties only, and one built with
    anyOf/oneOf/allOf or the like is not checked beyond them. A property whose name is not a
    Python identifier cannot be a keyword argument and is left out. A schema without
    `properties` (any object) gets any keyword arguments, any JSON values."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        keyword = f"{_ANY_KEYWORD} {literal('=')} {json_term(None, default={})}"
        return [f"{head}: ({head}_kv ({literal(', ')} {head}_kv)*)?", f"{head}_kv: {keyword}"]
    required = set(schema.get("required") or ())
    # References into the schema's definitions still resolve from a property's own schema.
    definitions = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    names = [name for name in properties if _IDENTIFIER.fullmatch(name)]
    rules = []
    # {head}_f{i}: the arguments from the i-th property on, none written before;
    # {head}_r{i}: the same after some argument (each then follows ", ").
    for i, name in enumerate(names):
        value = properties[name]
        if isinstance(value, dict) and definitions:
            value = {**value, **definitions}
        rules.append(f"{head}_v{i}: {literal(name + '=')} {json_term(value, default={})}")
        rest, first = f"{head}_r{i + 1}", f"{head}_f{i + 1}"
        if name in required:
            rules.append(f"{head}_f{i}: {head}_v{i} {rest}")
            after = f"{literal(', ')} {head}_v{i} {rest}"
        else:
            rules.append(f"{head}_f{i}: {head}_v{i} {rest} | {first}")
            after = f"({literal(', ')} {head}_v{i})? {rest}"
        if i > 0:  # the first property never follows another
            rules.append(f"{head}_r{i}: {after}")
    empty = literal("")
    rules.append(f"{head}_f{len(names)}: {empty}")
    if names:
        rules.append(f"{head}_r{len(names)}: {empty}")
    return [f"{head}: {head}_f0", *rules]
