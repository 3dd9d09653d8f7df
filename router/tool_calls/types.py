"""What every tool-call parser shares: the tools a request offers, the calls found, and the
pieces a stream is made of."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True)
class Tool:
    """One function of the request's `tools`."""

    name: str
    description: str | None = None
    # The JSON schema of its arguments (OpenAI's `parameters`); {} when not given (any object).
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI's `function.arguments`
    # The id the model wrote for the call, where its format has one (Kimi K2's
    # `functions.get_weather:0`): its template reads it back from the history, so it is the
    # call's `id`. None: the server makes one up.
    id: str | None = None


@dataclass(frozen=True)
class Parsed:
    """A whole answer split: the text that is not a call (None when there is none) and the
    calls in order."""

    content: str | None
    calls: list[ToolCall]


@dataclass(frozen=True)
class TextDelta:
    """Text of the answer that is not part of a call (`delta.content`)."""

    text: str


@dataclass(frozen=True)
class CallDelta:
    """A piece of the `index`-th call (0-based over the answer): its first delta carries the
    name (and may carry arguments); later ones carry only argument fragments. The fragments of
    one call joined are its arguments' JSON text."""

    index: int
    name: str | None = None
    arguments: str = ""
    id: str | None = None  # with the name: the id the model wrote (ToolCall.id)


Delta = TextDelta | CallDelta

# Renders a marker (`<tool_call>`, `[TOOL_CALLS]`, `<|python_tag|>`) as a Lark term for
# llguidance: the token itself where the marker is one token of the vocabulary (`<[id]>`), else
# the quoted text.
MarkerTerm = Callable[[str], str]


class ToolStream(Protocol):
    def push(self, text: str) -> list[Delta]:
        """More of the answer's text; returns what can be told now. Text that may still turn out
        to be (part of) a call's markup is held back, never sent as content."""

    def finish(self) -> list[Delta]:
        """The answer ended: what was held back (an unfinished or malformed call is content)."""


class ToolParser(Protocol):
    name: ClassVar[str]  # as --tool-call-parser names it (vLLM's names)
    # Markers that are special tokens in the family's tokenizers: their text must reach the
    # parser although the answer's text leaves special tokens out.
    markers: ClassVar[tuple[str, ...]]

    def for_tools(self, tools: Sequence[Tool]) -> ToolParser:
        """The parser for one request's answers: formats whose arguments are text (the XML
        ones) read each value's type from its tool's schema; the others return themselves."""

    def parse(self, text: str) -> Parsed: ...

    def stream(self) -> ToolStream: ...

    def grammar(self, tools: Sequence[Tool], parallel: bool, marker: MarkerTerm) -> str:
        """A Lark grammar (llguidance's dialect) for answers that are only calls, one or more
        (`parallel`) of `tools`, in this format, each call's arguments following its tool's
        schema (`%json`)."""
