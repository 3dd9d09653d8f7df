"""GLM-4.5's calls (glm45; GLM-4.6 the same) and GLM-4.7's (glm47): the function's name right
after the block's tag, then key and value tag pairs; GLM-4.7 writes no newlines between them.
Either parser reads both layouts; each enforces its own.

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>
"""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

from router.tool_calls.xml_calls import XmlCallParser, XmlFormat, XmlLayout

ARG_TAGS = ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


class Glm45Parser(XmlCallParser):
    name: ClassVar[str] = "glm45"
    # Added tokens of GLM's vocabulary; listed in case a tokenizer marks them special.
    markers: ClassVar[tuple[str, ...]] = ("<tool_call>", "</tool_call>", *ARG_TAGS)
    format = XmlFormat(
        block_open="<tool_call>",
        block_close="</tool_call>",
        call_head=re.compile(r"(?P<name>[^\s<]+)"),
        call_close=None,
        param_head=re.compile(r"<arg_key>(?P<key>[^<]*)</arg_key>\s*<arg_value>"),
        param_close="</arg_value>",
    )
    layout = XmlLayout(
        call_open=lambda name: f"{name}\n",
        call_end="",
        param_open=lambda key, _kind: f"<arg_key>{key}</arg_key>\n<arg_value>",
        value_end="</arg_value>",
        param_end="\n",
        separator="\n",
    )


class Glm47Parser(Glm45Parser):
    name: ClassVar[str] = "glm47"
    layout = dataclasses.replace(
        Glm45Parser.layout,
        call_open=lambda name: name,
        param_open=lambda key, _kind: f"<arg_key>{key}</arg_key><arg_value>",
        param_end="",
        separator="",
    )
