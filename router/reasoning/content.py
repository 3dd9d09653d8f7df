"""What some families wrap the content after their think block in, taken off as it streams
(a think parser's `content_stage`): ERNIE 4.5's `<response>…</response>` and Hunyuan-A13B's
`<answer>…</answer>` (`AnswerTags`), Kimi K2's `(no content)` placeholder (`Placeholder`).

Both drop the content's leading whitespace (a stream holds it until text follows), so content
that is only whitespace, tags or placeholders is no content.
"""

from __future__ import annotations

from typing import Literal

from router.reasoning.stream import Delta, SteppedStream, merged, partial_suffix
from router.reasoning.types import ContentDelta


class _Stage(SteppedStream):
    """Content in, content out; nothing goes out until some text that is not whitespace."""

    def __init__(self) -> None:
        self._buf = ""
        self._said = False

    def _say(self, text: str, out: list[Delta]) -> None:
        if not self._said:
            text = text.lstrip()
        if text:
            out.append(ContentDelta(text))
            self._said = True


class AnswerTags(_Stage):
    """`open` where the content starts (after whitespace) and the first `close` go, with the
    whitespace inside them; what follows `close` stays content, whitespace at the very end goes.
    An answer cut off before `close` keeps its text (a partial tag at its end is text)."""

    def __init__(self, open_: str, close: str) -> None:
        super().__init__()
        self._open, self._close = open_, close
        self._state: Literal["lead", "body", "after"] = "lead"

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        self._say(self._buf.rstrip(), out)  # a partial tag is text; trailing whitespace goes
        self._buf = ""
        return merged(out)

    def _step(self, out: list[Delta]) -> bool:
        if self._state == "lead":
            self._buf = self._buf.lstrip()
            if self._buf.startswith(self._open):
                self._buf, self._state = self._buf[len(self._open) :], "body"
            elif self._open.startswith(self._buf):
                return False  # "<ans" may still become the tag
            else:
                self._state = "body"
            return True
        if self._state == "body":
            at = self._buf.find(self._close)
            if at >= 0:
                self._say(self._buf[:at].rstrip(), out)
                self._buf, self._state = self._buf[at + len(self._close) :], "after"
                return True
        # Hold back a possible `close` (in the body) and whitespace that may end the content.
        keep = partial_suffix(self._buf, self._close) if self._state == "body" else 0
        head = self._buf[: len(self._buf) - keep]
        text = head.rstrip()
        self._say(text, out)
        self._buf = self._buf[len(text) :]
        return False


class Placeholder(_Stage):
    """Every `text` in the content goes (Kimi K2 writes `(no content)` before calls when it has
    nothing to say)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self._text = text

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        self._say(self._buf, out)  # a partial placeholder is text
        self._buf = ""
        return merged(out)

    def _step(self, out: list[Delta]) -> bool:
        at = self._buf.find(self._text)
        if at >= 0:
            self._say(self._buf[:at], out)
            self._buf = self._buf[at + len(self._text) :]
            return True
        keep = partial_suffix(self._buf, self._text)
        self._say(self._buf[: len(self._buf) - keep], out)
        self._buf = self._buf[len(self._buf) - keep :]
        return False
