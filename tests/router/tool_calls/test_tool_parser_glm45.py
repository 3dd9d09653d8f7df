"""The glm45 and glm47 parsers (GLM-4.5/4.6/4.7): the name after `<tool_call>`, then
`<arg_key>`/`<arg_value>` pairs; either layout read by both."""

from __future__ import annotations

from router.tool_calls.glm45 import Glm45Parser, Glm47Parser
from router.tool_calls.types import Parsed, Tool, ToolCall

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
          "where": {"type": "object"}}}  # fmt: skip
PARSER = Glm45Parser().for_tools([Tool("get_weather", None, SCHEMA)])
GLM45 = (
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
)
GLM47 = (
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>"
    '<arg_key>where</arg_key><arg_value>{"lat": 41.9}</arg_value></tool_call>'
)
WHOLE = [
    ("No call here.", Parsed("No call here.", [])),
    (
        "Checking.\n" + GLM45,
        Parsed("Checking.", [ToolCall("get_weather", '{"city": "Paris", "days": 3}')]),
    ),
    (
        GLM45 + "\n" + GLM47,
        Parsed(None, [ToolCall("get_weather", '{"city": "Paris", "days": 3}'),
                      ToolCall("get_weather", '{"city": "Rome", "where": {"lat": 41.9}}')]),
    ),
    ("<tool_call>ping</tool_call>", Parsed(None, [ToolCall("ping", "{}")])),
]  # fmt: skip

MALFORMED = [
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call>",  # key without value
    "<tool_call>get_weather\n<arg_value>Paris</arg_value>\n</tool_call>",  # value without key
    "<tool_call>get weather</tool_call>",  # text after the name
    GLM45.removesuffix("</tool_call>"),
    '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',  # Hermes' JSON
]


def test_glm47_reads_glm45s_layout_too():
    tools = [Tool("get_weather", None, SCHEMA)]
    expected = Glm45Parser().for_tools(tools).parse(GLM45 + GLM47)
    assert Glm47Parser().for_tools(tools).parse(GLM45 + GLM47) == expected
