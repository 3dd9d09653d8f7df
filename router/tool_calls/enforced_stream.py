"""Streaming the calls an enforced `tool_choice` makes: their arguments as they are written.

Under `required` or a named function the grammar (each parser's `grammar`) decides every
character of the answer but the arguments' values, so a call cannot turn out malformed: its
name can be told as soon as its head is written and its arguments streamed in fragments, as
OpenAI streams them. (Under `auto` a call is told only once complete and checked, since a
botched one must stay text.) Only the JSON formats: pythonic and the XML formats' arguments are
not JSON text until converted, so their calls stream whole.
"""

from __future__ import annotations

import re

from router.tool_calls.types import CallDelta, Delta

_HERMES = re.compile(r'<tool_call>\s*\{"name": "(?P<name>[^"]+)", "arguments": ')
_LLAMA3 = re.compile(r'\{"name": "(?P<name>[^"]+)", "parameters": ')
# A call object in a JSON list (granite, phi4_mini_json, hunyuan_a13b).
_LISTED = re.compile(r'\{"name": "(?P<name>[^"]+)", "arguments": ')
# What the grammars write before a call's arguments object (with the separators their JSON
# uses), by parser name; `name` is the function's.
ARGUMENT_HEADS: dict[str, re.Pattern[str]] = {
    "hermes": _HERMES,
    "llama3_json": _LLAMA3,
    "llama4_json": _LLAMA3,  # llama3_json under vLLM's other name
    "granite": _LISTED,
    "phi4_mini_json": _LISTED,
    "hunyuan_a13b": _LISTED,
    "mistral": re.compile(
        r'\{"name": "(?P<name>[^"]+)", "arguments": |\[TOOL_CALLS\](?P<bare>[^\[\s]+)\[ARGS\]'
    ),
    "ernie45": _HERMES,  # Hermes' blocks under vLLM's other name
    "deepseek_v3": re.compile(
        r"<｜tool▁call▁begin｜>function<｜tool▁sep｜>(?P<name>[^\n]+)\n```json\n"
    ),
    "deepseek_v31": re.compile(r"<｜tool▁call▁begin｜>(?P<name>[^<]+)<｜tool▁sep｜>"),
    "kimi_k2": re.compile(
        r"<\|tool_call_begin\|>(?P<id>functions\.(?P<name>[^\s<]+?):\d+)"
        r"<\|tool_call_argument_begin\|>"
    ),
    # The canonical form the harmony reasoning parser passes on, or the grammar's own header.
    "openai": re.compile(
        r"<\|channel\|>\w+ to=functions\.(?P<name>[^\s<]+)\s*(?:<\|constrain\|>)?\w*<\|message\|>"
    ),
}


class EnforcedCallStream:
    """A ToolStream over grammar-written calls: a call's head gives its name, then the
    arguments object goes out as it comes, up to the brace that closes it."""

    def __init__(self, head: re.Pattern[str]) -> None:
        self._head = head
        self._held = ""  # markup between calls, until a head is complete
        self._index = -1
        self._in_arguments = False
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def push(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        self._held += text
        while self._held:
            if not self._in_arguments:
                found = self._head.search(self._held)
                if found is None:
                    break
                self._index += 1
                groups = found.groupdict()
                name = groups.get("name") or groups["bare"]
                out.append(CallDelta(self._index, name=name, id=groups.get("id")))
                self._held = self._held[found.end() :]
                self._in_arguments, self._depth = True, 0
                continue
            end = self._arguments_end(self._held)
            fragment = self._held if end is None else self._held[:end]
            self._held = "" if end is None else self._held[end:]
            if fragment:
                out.append(CallDelta(self._index, arguments=fragment))
            if end is not None:
                self._in_arguments = False
        return out

    def finish(self) -> list[Delta]:
        return []  # what is held is markup (or a call cut by the length limit)

    def _arguments_end(self, text: str) -> int | None:
        """Where the arguments object closes in `text` (just past its brace), following JSON
        strings and nesting across pushes; None while it is still open."""
        for i, ch in enumerate(text):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return None
