"""What every reasoning parser shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol


@dataclass(frozen=True)
class Split:
    """A whole answer: its reasoning and its content (None where there is none)."""

    reasoning: str | None
    content: str | None


@dataclass(frozen=True)
class ReasoningDelta:
    text: str  # `delta.reasoning_content`


@dataclass(frozen=True)
class ContentDelta:
    text: str  # `delta.content` (what a tool-call parser, if any, reads next)


class ReasoningStream(Protocol):
    def push(self, text: str) -> list[ReasoningDelta | ContentDelta]:
        """More text; a tail that may be the start of a marker is held back."""

    def finish(self) -> list[ReasoningDelta | ContentDelta]: ...


class ReasoningParser(Protocol):
    name: ClassVar[str]  # as --reasoning-parser names it (vLLM's names)
    # Special tokens whose text the parser must see in the answer (the answer's text leaves
    # special tokens out); each must be one token of the vocabulary (checked at startup).
    markers: ClassVar[tuple[str, ...]]
    # Whether the reasoning is one think block from `start` to `end`, markers that are tokens,
    # which a grammar waits out (router/reasoning/gate.py). Else a grammar constrains the answer
    # from its first token: harmony's channels (where `start`, `end` and `optional` do not
    # apply), and think blocks spelled in plain text (router/reasoning/text_markers.py).
    gated: ClassVar[bool]
    start: ClassVar[str]  # "<think>"
    end: ClassVar[str]  # "</think>"
    # Whether the model may answer without a think block (Qwen3: it thinks only when its answer
    # opens one); else an answer starts in reasoning (DeepSeek-R1).
    optional: ClassVar[bool]

    def parse(self, text: str, opened: bool) -> Split:
        """`opened`: the prompt itself ends inside a think block (its last `start` comes after
        its last `end`, as DeepSeek-R1's template opens one): the answer begins in reasoning."""

    def stream(self, opened: bool) -> ReasoningStream: ...
