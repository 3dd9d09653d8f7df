"""What a request's `tools` and `tool_choice` ask of the server: which tools the template shows
the model, whether the answer is searched for calls, and the grammar an enforced choice runs
under.

- `none`: the tools are shown (the template decides how), the answer is only text.
- `auto` (OpenAI's default when tools are given): the model chooses; the answer is searched for
  calls in the --tool-call-parser's format. Not constrained: a free answer stays free, and a
  call the model botches stays text (as vLLM's auto). Needs --enable-auto-tool-choice, as vLLM.
- `required`, or a named function: the answer is only calls (one, for a named function or
  `parallel_tool_calls: false`), enforced by a grammar in the parser's format built from the
  tools' parameter schemas, so every call parses and its arguments follow the schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from router.api.chat import ChatRequest
from router.chat_features import ChatFeatures
from router.errors import ValidationError
from router.structured import GrammarSpec
from router.tool_calls.types import Tool, ToolParser


@dataclass(frozen=True)
class ToolPlan:
    template_tools: list[dict[str, Any]] | None  # what the chat template gets as `tools`
    parser: ToolParser | None  # searches the answer for calls (None: all text)
    grammar: GrammarSpec | None  # an enforced choice


NO_TOOLS = ToolPlan(None, None, None)


def plan_tools(body: ChatRequest, features: ChatFeatures) -> ToolPlan:
    choice = body.tool_choice
    if not body.tools:
        if choice is None or choice in ("none", "auto"):
            return NO_TOOLS
        raise ValidationError(f"`tool_choice` {body.tool_choice_name} needs `tools`")
    tools = [t.tool() for t in body.tools]
    _check_names(tools)
    shown = [t.for_template() for t in body.tools]
    if choice == "none":
        return ToolPlan(shown, None, None)
    parser = features.tool_parser
    if parser is not None:
        parser = parser.for_tools(tools)
    if choice is None or choice == "auto":
        if parser is None or not features.auto_tool_choice:
            raise ValidationError(
                f"`tools` with `tool_choice` {body.tool_choice_name} need the server started "
                "with --enable-auto-tool-choice and --tool-call-parser (the model's call format); "
                'send `tool_choice: "none"` to show the tools without calls'
            )
        return ToolPlan(shown, parser, None)
    if parser is None:
        raise ValidationError(
            f"`tool_choice` {body.tool_choice_name} needs the server started with "
            "--tool-call-parser (the model's call format)"
        )
    parallel = body.parallel_tool_calls is not False
    if choice != "required":
        named = [t for t in tools if t.name == choice.function.name]
        if not named:
            raise ValidationError(
                f"`tool_choice.function.name` {json.dumps(choice.function.name)} is not one of "
                f"`tools`: {', '.join(t.name for t in tools)}"
            )
        tools, parallel = named, False
    try:
        grammar = parser.grammar(tools, parallel, features.marker)
    except ValueError as err:  # a tool the format cannot express
        raise ValidationError(f"`tools` cannot be enforced as {parser.name} calls: {err}") from None
    return ToolPlan(shown, parser, GrammarSpec("lark", grammar, "tools"))


def _check_names(tools: list[Tool]) -> None:
    seen: set[str] = set()
    for tool in tools:
        if tool.name in seen:
            raise ValidationError(f"`tools` names the function {tool.name!r} twice")
        seen.add(tool.name)
