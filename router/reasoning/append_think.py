"""`minimax_m2_append_think`: MiniMax-M2's think block left in the content, for clients that hand
the whole turn back to the model (its interleaved thinking wants the block in the history).

MiniMax-M2's template opens `<think>` in the prompt, so the answer is `…</think>…`: where it starts
inside the block (`opened`), the content is `<think>` and the answer as written; otherwise the
answer as written. Nothing goes to `reasoning_content`. A grammar still waits for `</think>`.
"""

from __future__ import annotations

from typing import ClassVar

from router.reasoning.stream import Delta
from router.reasoning.types import ContentDelta, Split


class MiniMaxM2AppendThinkParser:
    name: ClassVar[str] = "minimax_m2_append_think"
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    markers: ClassVar[tuple[str, ...]] = (start, end)  # their text must reach the content
    gated: ClassVar[bool] = True
    optional: ClassVar[bool] = False

    def parse(self, text: str, opened: bool) -> Split:
        return Split(None, ((self.start if opened else "") + text) if text else None)

    def stream(self, opened: bool) -> AppendThinkStream:
        return AppendThinkStream(self.start if opened else "")


class AppendThinkStream:
    def __init__(self, head: str) -> None:
        self._head = head  # what goes before the answer's first text

    def push(self, text: str) -> list[Delta]:
        if not text:
            return []
        text, self._head = self._head + text, ""
        return [ContentDelta(text)]

    def finish(self) -> list[Delta]:
        return []
