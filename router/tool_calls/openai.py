"""gpt-oss's calls (`openai`), as the harmony reasoning parser (`--reasoning-parser
openai_gptoss`, router/reasoning/harmony.py) passes them on in the content: each a message

    <|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}<|call|>

A recipient `functions.NAME` with a JSON object as body is a call of NAME; any other recipient
(gpt-oss's built-in `browser.*`, `python`), or a body that is not an object, stays content as
written. Text around the messages (a preamble) is content. A header may also carry a content
type (`json`, `<|constrain|>json`), as the model's own headers do, and a message ends at
`<|call|>`; one that does not end before the next `<|channel|>` is not a call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from router.reasoning.harmony import CALL, CHANNEL, CONSTRAIN, MESSAGE, read_header
from router.tool_calls.common import (
    Piece,
    ScanParser,
    calls_rules,
    dump_arguments,
    json_term,
    lark,
    literal,
    load_json,
    partial_marker,
)
from router.tool_calls.types import MarkerTerm, Tool, ToolCall

NAMESPACE = "functions."
# A name that fits in a header: no whitespace, no markup.
_NAME = re.compile(r"[^\s<>]+")


class OpenAIParser(ScanParser):
    name: ClassVar[str] = "openai"
    markers: ClassVar[tuple[str, ...]] = (CHANNEL, CONSTRAIN, MESSAGE, CALL)

    def scan(self, text: str, at_start: bool, final: bool) -> tuple[list[Piece], int]:
        pieces: list[Piece] = []
        pos = 0
        while True:
            start = text.find(CHANNEL, pos)
            if start < 0:
                end = len(text) if final else len(text) - partial_marker(text[pos:], (CHANNEL,))
                pieces.append(text[pos:end])
                return pieces, end
            pieces.append(text[pos:start])
            body = text.find(MESSAGE, start)
            close = text.find(CALL, body) if body >= 0 else -1
            following = text.find(CHANNEL, start + len(CHANNEL))
            if close < 0 or 0 <= following < close:
                if following >= 0:  # not a call: content up to the next message
                    pieces.append(text[start:following])
                    pos = following
                    continue
                if not final:
                    return pieces, start  # the message may still end
                pieces.append(text[start:])
                return pieces, len(text)
            pos = close + len(CALL)
            call = _call(text[start:body], text[body + len(MESSAGE) : close])
            pieces.append(call if call is not None else text[start:pos])

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        """Each call as gpt-oss writes one (`<|call|>` ends the turn, so a model stops after its
        first call even where `parallel` allows more)."""
        for tool in tools:
            if not _NAME.fullmatch(tool.name):
                raise ValueError(f"the name {tool.name!r} cannot stand in a harmony header")

        def call(tool: Tool) -> str:
            head = literal(f"commentary to={NAMESPACE}{tool.name} ")
            return (
                f"{marker(CHANNEL)} {head} {marker(CONSTRAIN)} {literal('json')} "
                f"{marker(MESSAGE)} {json_term(tool.parameters)} {marker(CALL)}"
            )

        return lark(calls_rules(tools, call, parallel))


def _call(header: str, body: str) -> ToolCall | None:
    """The call a message is, None where it is not one."""
    _, recipient = read_header(header)
    if recipient is None or not recipient.startswith(NAMESPACE):
        return None
    name = recipient[len(NAMESPACE) :]
    arguments = load_json(body)
    if not name or not isinstance(arguments, dict):
        return None
    return ToolCall(name, dump_arguments(arguments))
