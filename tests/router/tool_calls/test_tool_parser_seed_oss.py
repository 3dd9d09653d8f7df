"""The seed_oss parser: Qwen3-Coder's tags in a `<seed:tool_call>` block, values inline."""

from __future__ import annotations

from router.tool_calls.seed_oss import SeedOssParser
from router.tool_calls.types import Parsed, Tool, ToolCall

SCHEMA = {
    "type": "object",
    "properties": {"cmd": {"type": "string"}, "timeout": {"type": "number"}},
}
PARSER = SeedOssParser().for_tools([Tool("run", None, SCHEMA)])
RUN = (
    "<seed:tool_call>\n<function=run>\n<parameter=cmd>ls -la</parameter>\n"
    "<parameter=timeout>2.5</parameter>\n</function>\n</seed:tool_call>"
)
WHOLE = [
    ("Nothing to run.", Parsed("Nothing to run.", [])),
    ("OK.\n" + RUN, Parsed("OK.", [ToolCall("run", '{"cmd": "ls -la", "timeout": 2.5}')])),
]
MALFORMED = [RUN.replace("</function>", ""), RUN.removesuffix("</seed:tool_call>")]
