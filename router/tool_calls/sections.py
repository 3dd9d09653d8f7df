"""The sectioned call formats (DeepSeek-V3, DeepSeek-V3.1, Kimi K2): the answer's calls in one
section, each call between its own markers, its arguments a JSON object.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>
    {"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(on one line).

The markers are special tokens of the families' vocabularies (their text reaches the parser
through `markers`). What a call's markers enclose, its body, differs by family: a format's
`body` pattern reads the name, the arguments and, where the family writes one, the call's id.
Text before the section is content. A section that never closes, or holds anything but calls,
is content as written; while it may still close, a stream holds it back. An argument may hold
a call's end marker as text: a call ends at the first end marker after which its body reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from router.tool_calls.common import (
    Piece,
    ScanParser,
    call_from_object,
    load_json,
    partial_marker,
    skip_spaces,
)
from router.tool_calls.types import ToolCall


@dataclass(frozen=True)
class SectionFormat:
    section_open: str
    section_close: str
    call_open: str
    call_close: str
    # Matches a call's whole body: groups `name` and `arguments`, and `id` where there is one.
    body: re.Pattern[str]


class SectionParser(ScanParser):
    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]]  # the format's markers (`markers_of`), and any more
    format: ClassVar[SectionFormat]

    def scan(self, text: str, at_start: bool, final: bool) -> tuple[list[Piece], int]:
        fmt = self.format
        start = text.find(fmt.section_open)
        if start < 0:
            held = 0 if final else partial_marker(text, (fmt.section_open,))
            return [text[: len(text) - held]], len(text) - held
        pieces: list[Piece] = [text[:start]]
        body = start + len(fmt.section_open)
        at = text.find(fmt.section_close, body)
        while at >= 0:
            calls = self._calls(text[body:at])
            if calls:
                end = at + len(fmt.section_close)
                # Text after the section is content, decided as any other.
                rest, used = self.scan(text[end:], False, final)
                return pieces + calls + rest, end + used
            at = text.find(fmt.section_close, at + len(fmt.section_close))
        if not final:
            return pieces, start  # it may still close
        return [text], len(text)  # not calls: all content

    def _calls(self, section: str) -> list[ToolCall] | None:
        fmt = self.format
        calls: list[ToolCall] = []
        pos = skip_spaces(section, 0)
        while pos < len(section):
            if not section.startswith(fmt.call_open, pos):
                return None
            begin = pos + len(fmt.call_open)
            at = section.find(fmt.call_close, begin)
            while at >= 0:
                call = self._call(section[begin:at])
                if call is not None:
                    break
                at = section.find(fmt.call_close, at + len(fmt.call_close))
            if at < 0:
                return None
            calls.append(call)
            pos = skip_spaces(section, at + len(fmt.call_close))
        return calls or None

    def _call(self, body: str) -> ToolCall | None:
        found = self.format.body.fullmatch(body)
        if found is None:
            return None
        name = found.group("name").strip()
        call = call_from_object({"name": name, "arguments": load_json(found.group("arguments"))})
        if call is None:
            return None
        written = found.groupdict().get("id")
        return ToolCall(call.name, call.arguments, written.strip() if written else None)


def markers_of(fmt: SectionFormat) -> tuple[str, ...]:
    return (fmt.section_open, fmt.section_close, fmt.call_open, fmt.call_close)
