"""DeepSeek's calls: V3 and R1-0528 (deepseek_v3) write each call's type, its name and its
arguments in a JSON code block; V3.1 and later (deepseek_v31) write the name and the bare
arguments.

    deepseek_v3:  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
                  ```json
                  {"city": "Paris"}
                  ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    deepseek_v31: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>
                  {"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>   (on one line)

V3's template puts a newline between calls; V3.1's puts nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from router.tool_calls.common import calls_rules, json_term, lark, literal
from router.tool_calls.sections import SectionFormat, SectionParser, markers_of
from router.tool_calls.types import MarkerTerm, Tool

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


def _format(body: str) -> SectionFormat:
    return SectionFormat(CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, re.compile(body, re.S))


class DeepSeekV3Parser(SectionParser):
    name: ClassVar[str] = "deepseek_v3"
    format = _format(
        rf"\s*(?:function)?{SEP}(?P<name>[^\n`]+?)\s*```(?:json)?(?P<arguments>.*?)```\s*"
    )
    markers: ClassVar[tuple[str, ...]] = (*markers_of(format), SEP)

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        def call(tool: Tool) -> str:
            return (
                f'{marker(CALL_BEGIN)} "function" {marker(SEP)} {literal(tool.name)} '
                f'"\\n```json\\n" {json_term(tool.parameters)} "\\n```" {marker(CALL_END)}'
            )

        around = (marker(CALLS_BEGIN), marker(CALLS_END))
        return lark(calls_rules(tools, call, parallel, separator=literal("\n"), around=around))


class DeepSeekV31Parser(SectionParser):
    name: ClassVar[str] = "deepseek_v31"
    format = _format(rf"(?P<name>[^<\s][^<]*?)\s*{SEP}(?P<arguments>.*)")
    markers: ClassVar[tuple[str, ...]] = (*markers_of(format), SEP)

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        def call(tool: Tool) -> str:
            return (
                f"{marker(CALL_BEGIN)} {literal(tool.name)} {marker(SEP)} "
                f"{json_term(tool.parameters)} {marker(CALL_END)}"
            )

        around = (marker(CALLS_BEGIN), marker(CALLS_END))
        return lark(calls_rules(tools, call, parallel, around=around))
