"""MiniMax-M2's calls (minimax_m2): all of an answer's calls in one block, values inline.

<minimax:tool_call>
<invoke name="get_weather">
<parameter name="city">Paris</parameter>
</invoke>
</minimax:tool_call>
"""

from __future__ import annotations

import re
from typing import ClassVar

from router.tool_calls.xml_calls import XmlCallParser, XmlFormat, XmlLayout

OPEN = "<minimax:tool_call>"
CLOSE = "</minimax:tool_call>"


class MiniMaxM2Parser(XmlCallParser):
    name: ClassVar[str] = "minimax_m2"
    markers: ClassVar[tuple[str, ...]] = (OPEN, CLOSE)
    format = XmlFormat(
        block_open=OPEN,
        block_close=CLOSE,
        call_head=re.compile(r'<invoke name="(?P<name>[^"]+)">'),
        call_close="</invoke>",
        param_head=re.compile(r'<parameter name="(?P<key>[^"]+)">'),
        param_close="</parameter>",
    )
    layout = XmlLayout(
        call_open=lambda name: f'<invoke name="{name}">\n',
        call_end="</invoke>\n",
        param_open=lambda key, _kind: f'<parameter name="{key}">',
        value_end="</parameter>",
        param_end="\n",
        block_per_call=False,
        block_head="\n",
    )
