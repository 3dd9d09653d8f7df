"""DeepSeek-V3.2's chat encoding: its release ships no Jinja chat template, only a Python
encoder (`encoding/encoding_dsv32.py`), so the conversation is rendered here, to the same text.

    <bos>{system}\\n\\n## Tools ... <functions>{one JSON schema per line}</functions>\\n
    <｜User｜>{user}<｜Assistant｜></think>            chat mode (or <think> after the last
    {answer}<｜end▁of▁sentence｜>                     user turn, thinking mode)

Tool calls are DSML (router/tool_calls/deepseek_v32.py reads them back): an assistant turn's
calls follow its text after a blank line,

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

and the tool turns that answer them are one `<function_results>` block of `<result>`s, closed
by the think tag the next answer starts from. In thinking mode the reasoning of turns before
the last user turn is dropped (the encoder's default); turns after it (a tool round in
progress) keep theirs, and each must carry reasoning or calls, as the encoder demands.

Thinking is off unless the request's `chat_template_kwargs` turn it on: `thinking` (DeepSeek
V3.1's template variable, which vLLM's V3.2 recipe uses) or `enable_thinking`. Tools go with the
first system message (a system message with no text is added where there is none), as the
release's examples place them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"

THINKING_VARIABLES = ("thinking", "enable_thinking")

_TOOLS_PREAMBLE = f"""## Tools

You have access to a set of tools you can use to answer the user's question.
You can invoke functions by writing a "<{DSML}function_calls>" block like the following as part \
of your reply to the user:
<{DSML}function_calls>
<{DSML}invoke name="$FUNCTION_NAME">
<{DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{DSML}parameter>
...
</{DSML}invoke>
<{DSML}invoke name="$FUNCTION_NAME2">
...
</{DSML}invoke>
</{DSML}function_calls>

String and scalar parameters should be specified as is without any escaping or quotes, while \
lists and objects should use JSON format. The "string" attribute should be set to "true" for \
string type parameters and "false" for other types (numbers, booleans, arrays, objects).

If the thinking_mode is enabled, then after function results you should strongly consider \
outputting a thinking block. Here is an example:

<{DSML}function_calls>
...
</{DSML}function_calls>

<function_results>
...
</function_results>

{THINK_START}...thinking about results{THINK_END}

Here are the functions available in JSONSchema format:
<functions>
"""


class EncodingError(ValueError):
    """A conversation the encoding cannot render (the chat endpoint answers 400 with it)."""


def _json(value: Any) -> str:
    # The encoder's own JSON: non-ASCII as it is, Python's default separators.
    return json.dumps(value, ensure_ascii=False)


def _tools_section(tools: Sequence[dict[str, Any]]) -> str:
    schemas = "\n".join(_json(tool["function"]) for tool in tools)
    return f"{_TOOLS_PREAMBLE}{schemas}\n</functions>\n"


def _call(call: dict[str, Any]) -> str:
    function = call["function"]
    arguments = function["arguments"]
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        raise EncodingError("a tool call's arguments must be a JSON object")
    parameters = "\n".join(
        f'<{DSML}parameter name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
        f"{value if isinstance(value, str) else _json(value)}</{DSML}parameter>"
        for key, value in arguments.items()
    )
    return f'<{DSML}invoke name="{function["name"]}">\n{parameters}\n</{DSML}invoke>'


def thinking_mode(variables: dict[str, Any]) -> bool:
    """Whether the request turns thinking on; other variables are refused (the encoding has no
    template to read them, and dropping one would ignore what the client asked)."""
    unknown = sorted(set(variables) - set(THINKING_VARIABLES))
    if unknown:
        raise EncodingError(
            f"`chat_template_kwargs`: DeepSeek-V3.2's chat encoding takes only "
            f"{' and '.join(f'`{v}`' for v in THINKING_VARIABLES)}; given {', '.join(unknown)}"
        )
    return any(bool(variables.get(name)) for name in THINKING_VARIABLES)


def _with_tools(
    messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    if not tools:
        return messages
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "tools": list(tools)}, *messages[1:]]
    return [{"role": "system", "content": "", "tools": list(tools)}, *messages]


class _Conversation:
    def __init__(self, messages: list[dict[str, Any]], thinking: bool) -> None:
        self.messages = messages
        self.thinking = thinking
        users = [i for i, m in enumerate(messages) if m["role"] in ("user", "developer")]
        self.last_user = users[-1] if users else -1

    def render(self) -> str:
        return BOS + "".join(self._message(i) for i in range(len(self.messages)))

    def _message(self, index: int) -> str:
        message = self.messages[index]
        role = message["role"]
        if role == "system":
            return self._system(message)
        if role in ("user", "developer"):
            return self._user(index, message)
        if role == "tool":
            return self._tool(index, message)
        if role == "assistant":
            return self._assistant(index, message)
        raise EncodingError(f"DeepSeek-V3.2's chat encoding has no role {role!r}")

    def _instructions(self, message: dict[str, Any]) -> str:
        return _tools_section(message["tools"]) if message.get("tools") else ""

    def _system(self, message: dict[str, Any]) -> str:
        tools = self._instructions(message)
        return (message.get("content") or "") + ("\n\n" + tools if tools else "")

    def _user(self, index: int, message: dict[str, Any]) -> str:
        content = message.get("content") or ""
        if message["role"] == "developer":
            if not content:
                raise EncodingError("a developer message needs content")
            tools = self._instructions(message)
            content = ("\n\n" + tools if tools else "") + f"\n\n# The user's message is: {content}"
        opens = self.thinking and index == self.last_user
        return f"{USER}{content}{ASSISTANT}{THINK_START if opens else THINK_END}"

    def _tool(self, index: int, message: dict[str, Any]) -> str:
        caller = index - 1
        while caller >= 0 and self.messages[caller]["role"] == "tool":
            caller -= 1
        assistant = self.messages[caller] if caller >= 0 else {}
        calls = assistant.get("tool_calls") if assistant.get("role") == "assistant" else None
        if not calls:
            raise EncodingError(f"messages[{index}]: a tool result without a call before it")
        order = index - caller
        if order > len(calls):
            raise EncodingError(
                f"messages[{index}]: more tool results than the assistant's {len(calls)} calls"
            )
        text = ("\n\n<function_results>" if order == 1 else "") + (
            f"\n<result>{message.get('content') or ''}</result>"
        )
        if order == len(calls):
            opens = self.thinking and index >= self.last_user
            text += "\n</function_results>\n\n" + (THINK_START if opens else THINK_END)
        return text

    def _assistant(self, index: int, message: dict[str, Any]) -> str:
        calls = message.get("tool_calls") or []
        reasoning = message.get("reasoning_content") or ""
        thought = ""
        if self.thinking and index > self.last_user:
            if not (reasoning or calls):
                raise EncodingError(
                    f"messages[{index}]: in thinking mode an assistant turn after the last user "
                    "turn needs its `reasoning_content` or tool calls"
                )
            thought = reasoning + THINK_END
        called = ""
        if calls:
            body = "\n".join(_call(call) for call in calls)
            called = f"\n\n<{DSML}function_calls>\n{body}\n</{DSML}function_calls>"
        return f"{thought}{message.get('content') or ''}{called}{EOS}"


def render(
    messages: list[dict[str, Any]],
    variables: dict[str, Any],
    tools: Sequence[dict[str, Any]] | None,
) -> str:
    """The prompt for a conversation (messages and tools in transformers' chat-template shapes),
    ending where the next answer starts."""
    thinking = thinking_mode(variables)
    messages = _with_tools(list(messages), tools)
    if thinking:
        # The encoder's drop_thinking: reasoning before the last user turn is not shown.
        last = _Conversation(messages, thinking).last_user
        messages = [
            {k: v for k, v in m.items() if k != "reasoning_content"}
            if m["role"] == "assistant" and i < last
            else m
            for i, m in enumerate(messages)
        ]
    return _Conversation(messages, thinking).render()
