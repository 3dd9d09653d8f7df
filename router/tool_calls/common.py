"""What the tool-call parsers share: the call object's checks, the JSON text of arguments, the
stream that turns a format's scanner into deltas, and the pieces of their grammars.

A format is written once, as a scanner (`ScanParser.scan`): given the text not yet decided, it
says which leading part is now decided (content text and calls, in order) and how much of the
text that was. `parse` runs it over the whole answer; the stream runs it after every push on
what it holds back, so a whole answer and a streamed one are split the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from router.regex_dialect import ecma_schema
from router.tool_calls.types import (
    CallDelta,
    Delta,
    MarkerTerm,
    Parsed,
    TextDelta,
    Tool,
    ToolCall,
)

# A decided part of the answer: text that is content (a malformed call included), or a call.
Piece = str | ToolCall

# The JSON of arguments in a grammar: the separators models write (and chat templates render
# with `tojson`), and no free whitespace, which a model under a grammar can otherwise run on in.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def dump_arguments(arguments: dict[str, Any]) -> str:
    """The JSON text of a call's arguments, as OpenAI's `function.arguments`."""
    return json.dumps(arguments, ensure_ascii=False)


def call_from_object(obj: Any, argument_keys: Sequence[str] = ("arguments",)) -> ToolCall | None:
    """A call from a decoded `{"name": ..., "arguments": {...}}`, None when it is not one: no
    string name, or arguments (the first of `argument_keys` present) that are not an object.
    Absent arguments are `{}`: a function without parameters may be called that way."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    key = next((k for k in argument_keys if k in obj), None)
    arguments = obj[key] if key is not None else {}
    if not isinstance(arguments, dict):
        return None
    return ToolCall(name, dump_arguments(arguments))


def calls_from_list(
    obj: Any, argument_keys: Sequence[str] = ("arguments",)
) -> list[ToolCall] | None:
    """The calls of a decoded JSON list whose every item is a call (`call_from_object`); None
    for anything else, an empty list included."""
    if not isinstance(obj, list) or not obj:
        return None
    calls = [call_from_object(item, argument_keys) for item in obj]
    if any(call is None for call in calls):
        return None
    return calls  # type: ignore[return-value]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Python's decoder takes NaN and Infinity, which OpenAI's `arguments` (JSON) cannot carry.
DECODER = json.JSONDecoder(parse_constant=_no_constant)


def load_json(text: str) -> Any:
    """The JSON value of `text` (whitespace around it allowed), None where it is not JSON (None
    is no call in every format)."""
    try:
        return DECODER.decode(text)
    except ValueError:
        return None


def decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value that starts at `text[pos]` and where it ends, None where there is none."""
    try:
        return DECODER.raw_decode(text, pos)
    except ValueError:
        return None


def skip_spaces(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def occurrences(text: str, needle: str, begin: int = 0) -> list[int]:
    """Where `needle` occurs in `text` from `begin` on (a closing marker a block may end at)."""
    found = []
    at = text.find(needle, begin)
    while at >= 0:
        found.append(at)
        at = text.find(needle, at + len(needle))
    return found


def partial_marker(text: str, markers: Sequence[str]) -> int:
    """The length of the longest tail of `text` that is the start of one of `markers` (but not
    the whole marker): what must wait for more text before it can be called content."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def parsed(text: str, pieces: Sequence[Piece]) -> Parsed:
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    if not calls:
        return Parsed(text, [])
    content = "".join(p for p in pieces if isinstance(p, str)).strip()
    return Parsed(content or None, calls)


class ScanParser:
    """A parser written as a scanner; subclasses give `name`, `markers`, `scan` and `grammar`."""

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]]

    def scan(self, text: str, at_start: bool, final: bool) -> tuple[list[Piece], int]:
        """Decides the head of `text` (what the stream still holds). `at_start`: `text` begins
        the answer. `final`: the answer ends here, so all of it must be decided. Returns the
        decided pieces and how many characters of `text` they cover."""
        raise NotImplementedError

    def for_tools(self, tools: Sequence[Tool]) -> ScanParser:
        return self

    def parse(self, text: str) -> Parsed:
        pieces, _ = self.scan(text, True, True)
        return parsed(text, pieces)

    def stream(self) -> ScanStream:
        return ScanStream(self)

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        raise NotImplementedError


class ScanStream:
    """Pushes go to the scanner with what is still held; decided pieces become deltas.

    Content is trimmed as `parse` trims it: the answer's leading whitespace is dropped, and
    trailing whitespace waits for more content (so none is sent before a call or at the end)."""

    def __init__(self, parser: ScanParser) -> None:
        self._parser = parser
        self._held = ""
        self._at_start = True
        self._spaces = ""  # whitespace after the last content sent, told only if content follows
        self._sent = False  # some content was sent: later leading whitespace is kept
        self._calls = 0

    def push(self, text: str) -> list[Delta]:
        if not text:
            return []
        self._held += text
        return self._run(final=False)

    def finish(self) -> list[Delta]:
        return self._run(final=True)

    def _run(self, final: bool) -> list[Delta]:
        pieces, used = self._parser.scan(self._held, self._at_start, final)
        if used:
            self._held = self._held[used:]
            self._at_start = False
        out: list[Delta] = []
        for piece in pieces:
            if isinstance(piece, ToolCall):
                out.append(CallDelta(self._calls, name=piece.name, id=piece.id))
                out.append(CallDelta(self._calls, arguments=piece.arguments))
                self._calls += 1
            else:
                out += self._content(piece)
        return out

    def _content(self, text: str) -> list[Delta]:
        if not self._sent:
            text = text.lstrip()
        text = self._spaces + text
        body = text.rstrip()
        self._spaces = text[len(body) :]
        if not body:
            return []
        self._sent = True
        return [TextDelta(body)]


def json_term(schema: Any, default: dict[str, Any] | None = None) -> str:
    """`%json` of a schema in llguidance's Lark; an empty or absent schema is `default` (for a
    tool's arguments, any object)."""
    if not isinstance(schema, dict) or not schema:
        schema = {"type": "object"} if default is None else default
    schema = ecma_schema(schema)  # patterns mean what they do for JSON Schema (ECMA-262)
    schema = {**schema, "x-guidance": {**_JSON_STYLE, **schema.get("x-guidance", {})}}
    return "%json " + json.dumps(schema)


def literal(text: str) -> str:
    """`text` as a quoted Lark literal."""
    return json.dumps(text)


def name_literal(name: str) -> str:
    """A tool's name as its JSON string, quoted for Lark (the exact name, nothing else)."""
    return literal(json.dumps(name))


def calls_rules(
    tools: Sequence[Tool],
    call: Callable[[Tool], str],
    parallel: bool,
    separator: str = "",
    around: tuple[str, str] = ("", ""),
) -> list[str]:
    """The rules `start` (one call, or with `parallel` one or more joined by `separator`, a Lark
    term; all between the terms `around`) and `call` (one of `tools`, each a rule `call_<i>`
    whose body `call` writes)."""
    calls = "call"
    if parallel:
        calls = f"call ({separator} call)*" if separator else "call+"
    start = " ".join(filter(None, (around[0], calls, around[1])))
    rules = [f"start: {start}", "call: " + " | ".join(f"call_{i}" for i in range(len(tools)))]
    rules += [f"call_{i}: {call(tool)}" for i, tool in enumerate(tools)]
    return rules


def lark(rules: Sequence[str]) -> str:
    return "\n".join(rules) + "\n"
