"""OpenAI's /v1/chat/completions body: messages, tools, logprobs, template variables."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema

from router.api.fields import MaxNewTokens
from router.api.openai import OpenAIRequest
from router.api.says import Says, Unsupported, field_error
from router.api.tools import MessageToolCall, ToolChoice, ToolDefinition
from router.errors import ValidationError
from router.request import FieldNames, GenerationRequest
from router.structured import GrammarSpec

# OpenAI's roles; any other is refused as OpenAI does, not handed to a template that might drop
# the message or render the unknown name as text.
ROLES = ("system", "developer", "user", "assistant", "tool", "function")

# apply_chat_template's own parameters and what the server decides itself: a request cannot
# set them through chat_template_kwargs.
RESERVED_TEMPLATE_VARIABLES = frozenset({
    "messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "processor_kwargs",
})  # fmt: skip


def _text(content: Any) -> str:
    """A message's text: a string, or a list of text parts (joined); null for a tool call."""
    if content is None:  # an assistant turn that only called tools
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise field_error(" must be a string or a list of parts")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise field_error(f": only text parts are supported. Given: {kind}")
        if not isinstance(part.get("text"), str):
            raise field_error(": a text part needs `text`")
        texts.append(part["text"])
    return "".join(texts)


TEXT_PART = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
Content = Annotated[
    str,
    PlainValidator(_text),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART},
                              {"type": "null"}]}),
]  # fmt: skip


# OpenAI's deprecated function calling: accepted only with the values that ask for nothing.
LEGACY = ": OpenAI's deprecated function calling; send `tools` and `tool_choice`"
NoFunctions = Annotated[Any, Unsupported([], None, why=LEGACY)]
FunctionCallNone = Annotated[Any, Unsupported("none", "auto", None, why=LEGACY)]


class ChatMessage(BaseModel):
    # Other members (an assistant turn's `refusal`, `annotations`...) do not reach the template.
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Annotated[
        Literal[ROLES],
        Says(f"must be one of {', '.join(ROLES)}. Given: {{given!r}}"),
    ]
    content: Content = ""
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers
    # An assistant turn's reasoning, as agents send it back within a tool round: the templates
    # that keep it there (Qwen3's, gpt-oss's, DeepSeek-V3.2's encoding) read `reasoning_content`.
    reasoning_content: str | None = None
    reasoning: str | None = None  # vLLM's newer name for the same

    def for_template(self, index: int) -> dict[str, Any]:
        """The message as chat templates read it (transformers' conventions)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            where = f"messages[{index}].tool_calls"
            try:
                out["tool_calls"] = [
                    c.for_template(f"{where}[{i}]") for i, c in enumerate(self.tool_calls)
                ]
            except ValueError as err:
                raise ValidationError(str(err)) from None
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        reasoning = self.reasoning_content if self.reasoning_content is not None else self.reasoning
        if reasoning is not None and self.role == "assistant":
            out["reasoning_content"] = reasoning
        return out


def _no_reserved(variables: dict[str, Any]) -> dict[str, Any]:
    reserved = sorted(RESERVED_TEMPLATE_VARIABLES.intersection(variables))
    if reserved:
        raise field_error(f" may not set {', '.join(f'`{k}`' for k in reserved)}")
    return variables


class ChatRequest(OpenAIRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1), Says("must be a non-empty list")]
    max_completion_tokens: MaxNewTokens | None = None
    logprobs: bool = False
    top_logprobs: (
        Annotated[int, Field(description="Alternatives per token; <= --max-top-n-tokens")] | None
    ) = None
    # vLLM's: extra variables for the chat template, such as Qwen3's `enable_thinking`.
    chat_template_kwargs: Annotated[dict[str, Any], AfterValidator(_no_reserved)] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None  # OpenAI's default: true
    functions: NoFunctions = None
    function_call: FunctionCallNone = None
    modalities: Annotated[Any, Unsupported(["text"], None)] = None

    def to_request(self, prompt: str, tool_grammar: GrammarSpec | None) -> GenerationRequest:
        """`prompt`: the messages through the model's chat template; `tool_grammar`: what an
        enforced `tool_choice` allows (router/tool_calls/choice.py)."""
        if self.top_logprobs is not None and not self.logprobs:
            raise ValidationError("`top_logprobs` requires `logprobs` to be true")
        given = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
        shared = self.shared()
        if tool_grammar is not None:
            if shared["grammar"] is not None:
                raise ValidationError(
                    f"`tool_choice` {self.tool_choice_name} enforces the calls' format: it "
                    f"cannot be combined with `{shared['grammar'].field.split('.')[0]}`"
                )
            shared["grammar"] = tool_grammar
        return GenerationRequest(
            inputs=prompt,
            names=FieldNames("messages", given, "top_logprobs", adapter="model"),
            # The template writes the special tokens it wants (BOS...): none are added (as TGI).
            add_special_tokens=False,
            max_new_tokens=self.max_completion_tokens or self.max_tokens,
            top_n_tokens=self.top_logprobs or None,
            **shared,
        )

    @property
    def tool_choice_name(self) -> str:
        """`tool_choice` as errors quote it: auto (OpenAI's default with tools), none..."""
        choice = self.tool_choice
        if choice is None:
            return '"auto"' if self.tools else '"none"'
        return f'"{choice}"' if isinstance(choice, str) else f"{{function: {choice.function.name}}}"
