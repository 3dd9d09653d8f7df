"""Qwen3-Coder's calls (qwen3_coder; Qwen3.5 and Qwen3-Coder-Next write them too): XML in
Hermes' `<tool_call>` block, one call to a block, each value on lines of its own.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>
"""

from __future__ import annotations

import re
from typing import ClassVar

from router.tool_calls.xml_calls import XmlCallParser, XmlFormat, XmlLayout

FUNCTION_FORMAT = XmlFormat(
    block_open="<tool_call>",
    block_close="</tool_call>",
    call_head=re.compile(r"<function=(?P<name>[^>\n]+)>"),
    call_close="</function>",
    param_head=re.compile(r"<parameter=(?P<key>[^>\n]+)>"),
    param_close="</parameter>",
)


class Qwen3CoderParser(XmlCallParser):
    name: ClassVar[str] = "qwen3_coder"
    format = FUNCTION_FORMAT
    layout = XmlLayout(
        call_open=lambda name: f"\n<function={name}>\n",
        call_end="</function>\n",
        param_open=lambda key, _kind: f"<parameter={key}>\n",
        value_end="\n</parameter>",
        param_end="\n",
        separator="\n",
    )


class Qwen3XmlParser(Qwen3CoderParser):
    """The same format under vLLM's other name for it."""

    name: ClassVar[str] = "qwen3_xml"
