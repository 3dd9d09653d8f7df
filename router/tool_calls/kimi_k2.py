"""Kimi K2's calls (kimi_k2): each call's id, `functions.<name>:<index>`, then its arguments.

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

(on one line).

Kimi's template writes an assistant's calls back with their `id`s and a tool's result under its
`tool_call_id`, so the id the model wrote is the call's id (vLLM's behaviour too); the index
counts the conversation's calls. The name is the id between `functions.` and `:<index>`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from router.tool_calls.common import calls_rules, json_term, lark, literal
from router.tool_calls.sections import SectionFormat, SectionParser, markers_of
from router.tool_calls.types import MarkerTerm, Tool

ARGUMENTS = "<|tool_call_argument_begin|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_END = "<|tool_call_end|>"


class KimiK2Parser(SectionParser):
    name: ClassVar[str] = "kimi_k2"
    format = SectionFormat(
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        CALL_BEGIN,
        CALL_END,
        re.compile(
            rf"\s*(?P<id>(?:functions\.)?(?P<name>[^\s<]+?):\d+)\s*{re.escape(ARGUMENTS)}"
            r"(?P<arguments>.*)",
            re.S,
        ),
    )
    markers: ClassVar[tuple[str, ...]] = (*markers_of(format), ARGUMENTS)

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        def call(tool: Tool) -> str:
            return (
                f"{marker(CALL_BEGIN)} {literal('functions.' + tool.name + ':')} /[0-9]+/ "
                f"{marker(ARGUMENTS)} {json_term(tool.parameters)} {marker(CALL_END)}"
            )

        fmt = self.format
        around = (marker(fmt.section_open), marker(fmt.section_close))
        return lark(calls_rules(tools, call, parallel, around=around))
