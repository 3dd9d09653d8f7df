"""The qwen3_coder parser (Qwen3-Coder, Qwen3.5): XML calls in `<tool_call>` blocks, values
typed by the tools' schemas."""

from __future__ import annotations

from router.tool_calls.qwen3_coder import Qwen3CoderParser
from router.tool_calls.types import Parsed, Tool, ToolCall

EDIT = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "old": {"type": "string"},
        "line": {"type": "integer"},
        "dry_run": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "note": {"type": ["string", "null"]},
    },
}
PARSER = Qwen3CoderParser().for_tools([Tool("edit", None, EDIT), Tool("ping")])


def call(*params: tuple[str, str], name: str = "edit") -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


CODE = "    if x:\n        return '</parameter>'\n"
WHOLE = [
    ("Plain text.", Parsed("Plain text.", [])),
    (
        "Editing.\n" + call(("path", "a.py"), ("line", "12"), ("dry_run", "True")),
        Parsed("Editing.", [ToolCall("edit", '{"path": "a.py", "line": 12, "dry_run": true}')]),
    ),
    # A string keeps its whitespace and may hold the format's own tags.
    (call(("old", CODE)),
     Parsed(None, [ToolCall("edit", '{"old": "    if x:\\n        return \'</parameter>\'\\n"}')])),
    (
        call(("tags", "['a', 'b']"), ("note", "None")) + "\n" + call(name="ping"),
        Parsed(None, [ToolCall("edit", '{"tags": ["a", "b"], "note": null}'),
                      ToolCall("ping", "{}")]),
    ),
    # A value the schema types but the model botched stays as text; an unknown key is text.
    (
        call(("line", "twelve"), ("extra", "7")) + " after",
        Parsed("after", [ToolCall("edit", '{"line": "twelve", "extra": "7"}')]),
    ),
]  # fmt: skip

MALFORMED = [
    # no </function>; no </parameter>
    "<tool_call>\n<function=edit>\n<parameter=path>\na\n</parameter>\n</tool_call>",
    "<tool_call>\n<function=edit>\n<parameter=path>\na\n</function>\n</tool_call>",
    call(("path", "a")).removesuffix("</tool_call>"),  # never closed
    '<tool_call>\n{"name": "edit", "arguments": {}}\n</tool_call>',  # Hermes' JSON
    "<tool_call>\n<function=edit>\n</function>\nstray\n</tool_call>",
    "<tool_call",
]
