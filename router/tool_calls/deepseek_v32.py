"""DeepSeek-V3.2's calls (deepseek_v32): DSML, MiniMax-M2's `<invoke>` layout under the
`｜DSML｜` prefix, each parameter saying whether its value is a string as written (`true`) or
JSON (`false`), so values are read back by that and not by the schema.

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

The chat encoding (router/chat_encoding/deepseek_v32.py) writes the block after the answer's
text and a blank line, and the values inline: a value's own newlines are kept.
"""

from __future__ import annotations

import re
from typing import ClassVar

from router.chat_encoding.deepseek_v32 import DSML
from router.tool_calls.xml_calls import XmlCallParser, XmlFormat, XmlLayout

OPEN = f"<{DSML}function_calls>"
CLOSE = f"</{DSML}function_calls>"


class DeepSeekV32Parser(XmlCallParser):
    name: ClassVar[str] = "deepseek_v32"
    markers: ClassVar[tuple[str, ...]] = (OPEN, CLOSE)
    format = XmlFormat(
        block_open=OPEN,
        block_close=CLOSE,
        call_head=re.compile(rf'<{DSML}invoke name="(?P<name>[^"]+)">'),
        call_close=f"</{DSML}invoke>",
        param_head=re.compile(
            rf'<{DSML}parameter name="(?P<key>[^"]+)" string="(?P<string>true|false)">'
        ),
        param_close=f"</{DSML}parameter>",
        values_on_lines=False,
    )
    layout = XmlLayout(
        call_open=lambda name: f'<{DSML}invoke name="{name}">\n',
        call_end=f"</{DSML}invoke>\n",
        param_open=lambda key, kind: (
            f'<{DSML}parameter name="{key}" string="{"true" if kind == "string" else "false"}">'
        ),
        value_end=f"</{DSML}parameter>",
        param_end="\n",
        block_per_call=False,
        block_head="\n",
    )
