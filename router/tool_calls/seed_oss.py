"""Seed-OSS's calls (seed_oss): Qwen3-Coder's function and parameter tags in a
`<seed:tool_call>` block, values inline.

    <seed:tool_call>
    <function=get_weather>
    <parameter=city>Paris</parameter>
    </function>
    </seed:tool_call>
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from router.tool_calls.qwen3_coder import FUNCTION_FORMAT
from router.tool_calls.xml_calls import XmlCallParser, XmlLayout

OPEN = "<seed:tool_call>"
CLOSE = "</seed:tool_call>"


class SeedOssParser(XmlCallParser):
    name: ClassVar[str] = "seed_oss"
    # Special tokens of Seed-OSS's vocabulary.
    markers: ClassVar[tuple[str, ...]] = (OPEN, CLOSE)
    format = dataclasses.replace(FUNCTION_FORMAT, block_open=OPEN, block_close=CLOSE)
    layout = XmlLayout(
        call_open=lambda name: f"\n<function={name}>\n",
        call_end="</function>\n",
        param_open=lambda key, _kind: f"<parameter={key}>",
        value_end="</parameter>",
        param_end="\n",
        separator="\n",
    )
