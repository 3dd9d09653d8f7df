"""A chat answer's text taken apart: the think block (`reasoning_content`, with
--reasoning-parser), the calls (`tool_calls`, with --tool-call-parser and tools offered) and
the rest (`content`); whole, and as a stream of OpenAI deltas."""

from __future__ import annotations

import secrets
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from router.entry import Token
from router.reasoning.types import ContentDelta, ReasoningDelta, ReasoningParser
from router.tool_calls.enforced_stream import ARGUMENT_HEADS, EnforcedCallStream
from router.tool_calls.types import CallDelta, TextDelta, ToolCall, ToolParser, ToolStream

_ALNUM = string.ascii_letters + string.digits


def call_id(parser: ToolParser, written: str | None = None) -> str:
    """A call's id: the one the model wrote where its format has one (`written`), else a new
    one. Mistral's templates take exactly nine letters and digits; others get OpenAI's `call_`
    form."""
    if written is not None:
        return written
    if parser.name == "mistral":
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class AnswerShape:
    """How one request's answers are taken apart."""

    reasoning: ReasoningParser | None
    # Where the answer starts (router/reasoning/gate.py first_state): "reasoning" (the prompt
    # opened a think block), "answer" (the prompt closed one just before it: nothing to split),
    # or "first" (the answer reasons only if it opens a block, or always, as its parser says).
    start: str
    tools: ToolParser | None
    markers: frozenset[str]  # special tokens the parsers must see
    enforced: bool = False  # the calls follow a grammar (tool_choice required or named)

    @property
    def plain(self) -> bool:
        return self.reasoning is None and self.tools is None

    def piece(self, token: Token) -> str:
        """A generated token's share of the text the parsers read: its text, and a special
        token's own text too where it is one of their markers."""
        if token.special and token.text in self.markers:
            return token.content + token.text
        return token.content

    def text(self, tokens: Iterable[Token], generated_text: str) -> str:
        return "".join(map(self.piece, tokens)) if self.markers else generated_text

    def message(self, text: str) -> dict[str, Any]:
        """The whole answer as OpenAI's `message`."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.reasoning is not None and self.start == "answer":
            message["reasoning_content"] = None
        elif self.reasoning is not None:
            split = self.reasoning.parse(text, self.start == "reasoning")
            message["reasoning_content"] = split.reasoning
            message["content"] = text = split.content
        if self.tools is not None and text is not None:
            parsed = self.tools.parse(text)
            message["content"] = parsed.content
            if parsed.calls:
                message["tool_calls"] = [self._call(c) for c in parsed.calls]
        return message

    def _call(self, call: ToolCall) -> dict[str, Any]:
        assert self.tools is not None
        return {
            "id": call_id(self.tools, call.id),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }

    def stream(self) -> AnswerStream:
        return AnswerStream(self)


def _tool_stream(shape: AnswerShape) -> ToolStream | None:
    """Enforced calls stream their arguments as written (router/tool_calls/enforced_stream.py);
    others are told once complete, by the parser's own stream."""
    if shape.tools is None:
        return None
    head = ARGUMENT_HEADS.get(shape.tools.name) if shape.enforced else None
    return EnforcedCallStream(head) if head is not None else shape.tools.stream()


class AnswerStream:
    """Text in, OpenAI `delta` objects out; held-back text (a marker not yet complete, a call
    not yet closed) is told at `finish`."""

    def __init__(self, shape: AnswerShape) -> None:
        self.shape = shape
        reasoning = shape.reasoning if shape.start != "answer" else None
        self._reasoning = reasoning.stream(shape.start == "reasoning") if reasoning else None
        self._tools = _tool_stream(shape)
        self._ids: dict[int, str] = {}

    @property
    def called(self) -> bool:
        return bool(self._ids)

    def push(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        if self._reasoning is None:
            return self._content(text)
        return self._split(self._reasoning.push(text))

    def finish(self) -> list[dict[str, Any]]:
        out = self._split(self._reasoning.finish()) if self._reasoning else []
        if self._tools is not None:
            out += self._deltas(self._tools.finish())
        return out

    def _split(self, parts: Sequence[ReasoningDelta | ContentDelta]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for part in parts:
            if isinstance(part, ReasoningDelta):
                out.append({"reasoning_content": part.text})
            else:
                out += self._content(part.text)
        return out

    def _content(self, text: str) -> list[dict[str, Any]]:
        if self._tools is None:
            return [{"content": text}] if text else []
        return self._deltas(self._tools.push(text))

    def _deltas(self, parts: Sequence[TextDelta | CallDelta]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for part in parts:
            if isinstance(part, TextDelta):
                if part.text:
                    out.append({"content": part.text})
                continue
            call: dict[str, Any] = {"index": part.index}
            function: dict[str, Any] = {"arguments": part.arguments}
            if part.name is not None:
                assert self.shape.tools is not None
                call["id"] = self._ids[part.index] = call_id(self.shape.tools, part.id)
                call["type"] = "function"
                function = {"name": part.name, "arguments": part.arguments}
            call["function"] = function
            out.append({"tool_calls": [call]})
        return out
