"""OpenAI's tool calling as /v1/chat/completions takes it: `tools`, `tool_choice`, and the
`tool_calls` of assistant messages in the history."""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from router.api.fields import BODY
from router.api.says import Says
from router.tool_calls.types import Tool

# OpenAI's rule for function names: templates and parsers rely on it too (a name is written
# into prompts and grammars as it is).
FUNCTION_NAME = r"^[a-zA-Z0-9_.-]{1,64}$"
FunctionName = Annotated[
    str,
    Field(pattern=FUNCTION_NAME, description="a-z, A-Z, 0-9, _ . - ; at most 64"),
    Says("must be 1 to 64 of a-z, A-Z, 0-9, underscores, dots and dashes. Given: {value}"),
]


class FunctionDefinition(BaseModel):
    model_config = BODY
    named_in_full: ClassVar[bool] = True  # `tools[0].function.name`

    name: FunctionName
    description: str | None = None
    parameters: (
        Annotated[dict[str, Any], Field(description="The JSON schema of the arguments")] | None
    ) = None
    strict: Annotated[bool, Field(description="Ignored: enforced calls follow it")] | None = None


class ToolDefinition(BaseModel):
    model_config = BODY

    type: Literal["function"]
    function: FunctionDefinition

    def tool(self) -> Tool:
        f = self.function
        return Tool(f.name, f.description, f.parameters or {})

    def for_template(self) -> dict[str, Any]:
        """As transformers' chat templates take a tool: OpenAI's shape, without nulls."""
        function: dict[str, Any] = {"name": self.function.name}
        if self.function.description is not None:
            function["description"] = self.function.description
        function["parameters"] = self.function.parameters or {"type": "object", "properties": {}}
        return {"type": "function", "function": function}


class NamedFunction(BaseModel):
    model_config = BODY
    named_in_full: ClassVar[bool] = True  # `tools[0].function.name`

    name: str


class NamedToolChoice(BaseModel):
    model_config = BODY
    named_in_full: ClassVar[bool] = True  # `tools[0].function.name`

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    # Clients echo back what they were sent (an `index` from a stream, say): extra is ignored.
    model_config = ConfigDict(strict=True, extra="ignore")
    named_in_full: ClassVar[bool] = True

    name: str
    arguments: str  # JSON text, as OpenAI answers it


class MessageToolCall(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction

    def for_template(self, where: str) -> dict[str, Any]:
        """The call as templates read it: arguments as an object (transformers' convention,
        which Llama's and Mistral's templates rely on: they write `arguments | tojson`)."""
        try:
            arguments = json.loads(self.function.arguments) if self.function.arguments else {}
        except ValueError as err:
            raise ValueError(f"`{where}.function.arguments` must be JSON text: {err}") from None
        if not isinstance(arguments, dict):
            raise ValueError(f"`{where}.function.arguments` must be a JSON object")
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.function.name, "arguments": arguments},
        }
