"""The think-block parsers: `<think>…</think>` reasoning before the answer (DeepSeek-R1, Qwen3,
GLM-4.5, MiniMax-M2; Seed-OSS's `<seed:think>…</seed:think>`).

They differ only where the answer does not begin with the opening tag: DeepSeek-R1 models
sometimes leave it out, and MiniMax-M2 and Seed-OSS answers start inside their block, so
deepseek_r1, minimax_m2 and seed_oss read such an answer as reasoning still (up to the closing
tag, or all of it); Qwen3 and GLM-4.5 without thinking write no block at all, so qwen3 and glm45
read it as content.

Whitespace: reasoning is stripped at both ends (Qwen3 writes `<think>\\n…\\n</think>`), content is
stripped at its start only where it follows `</think>`. A stream gives the same text as `parse`
of the whole: it drops whitespace after a marker and holds back whitespace at the end of the
reasoning until more reasoning comes (dropped if `</think>` or the end comes first).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from router.reasoning.types import ContentDelta, ReasoningDelta, Split

Delta = ReasoningDelta | ContentDelta


class ThinkParser:
    """`<think>` reasoning `</think>` content; subclasses say what an answer without the opening
    tag is (`optional`: content, else reasoning)."""

    name: ClassVar[str]
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    markers: ClassVar[tuple[str, ...]] = (start, end)
    gated: ClassVar[bool] = True
    optional: ClassVar[bool]  # the answer thinks only if it begins with `start`

    def parse(self, text: str, opened: bool) -> Split:
        body = text
        if not opened:
            lead = text.lstrip()
            if lead.startswith(self.start):
                body = lead[len(self.start) :]
            elif self.optional:
                return Split(None, text or None)
        reasoning, closed, content = body.partition(self.end)
        return Split(reasoning.strip() or None, (content.lstrip() or None) if closed else None)

    def stream(self, opened: bool) -> ThinkStream:
        return ThinkStream(self, opened)


class DeepSeekR1Parser(ThinkParser):
    name = "deepseek_r1"
    optional = False


class Qwen3Parser(ThinkParser):
    name = "qwen3"
    optional = True


class Glm45Parser(ThinkParser):
    name = "glm45"
    optional = True


class MiniMaxM2Parser(ThinkParser):
    name = "minimax_m2"
    optional = False


class SeedOssParser(ThinkParser):
    name = "seed_oss"
    start = "<seed:think>"
    end = "</seed:think>"
    markers = (start, end)
    optional = False


State = Literal["lead", "reasoning", "content"]


class SteppedStream:
    """A stream that takes its buffered text apart one `_step` at a time: pushed text joins the
    buffer, and steps run while they make progress (a step returns False to wait for more)."""

    _buf: str

    def push(self, text: str) -> list[Delta]:
        self._buf += text
        out: list[Delta] = []
        while self._buf and self._step(out):
            pass
        return merged(out)

    def _step(self, out: list[Delta]) -> bool:
        raise NotImplementedError


class ThinkStream(SteppedStream):
    """One answer's text as it comes, taken apart as `ThinkParser.parse` takes the whole."""

    def __init__(self, parser: ThinkParser, opened: bool) -> None:
        self._parser = parser
        # "lead": not yet known whether the answer opens with `start` (only when not opened).
        self._state: State = "reasoning" if opened else "lead"
        self._buf = ""  # text not yet given out: a possible marker's beginning
        self._reasoned = False  # some reasoning was given out (so leading whitespace is gone)
        self._space = ""  # whitespace at the end of the reasoning so far, held back
        self._skip_space = False  # content right after `end`: its leading whitespace goes

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._state == "lead":
            # It never began with `start`: what was held back is plain text.
            self._state = "content" if self._parser.optional else "reasoning"
        text, self._buf = self._buf, ""
        if self._state == "reasoning":
            self._reason(text, out)  # a partial end marker is reasoning after all
        else:
            self._content(text, out)
        self._space = ""  # reasoning cut off: its trailing whitespace goes, as in parse
        return merged(out)

    def _step(self, out: list[Delta]) -> bool:
        """Handles what it can of the buffer; False when the rest must wait for more text."""
        start, end = self._parser.start, self._parser.end
        if self._state == "lead":
            lead = self._buf.lstrip()
            if lead.startswith(start):
                self._buf, self._state = lead[len(start) :], "reasoning"
            elif start.startswith(lead):
                return False  # "  <thi": may still become the opening tag
            else:
                self._state = "content" if self._parser.optional else "reasoning"
            return True
        if self._state == "reasoning":
            at = self._buf.find(end)
            if at >= 0:
                self._reason(self._buf[:at], out)
                self._buf, self._state = self._buf[at + len(end) :], "content"
                self._space, self._skip_space = "", True
                return True
            keep = partial_suffix(self._buf, end)
            self._reason(self._buf[: len(self._buf) - keep], out)
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        text, self._buf = self._buf, ""
        self._content(text, out)
        return False

    def _reason(self, text: str, out: list[Delta]) -> None:
        if not self._reasoned:
            text = text.lstrip()
            if not text:
                return
            self._reasoned = True
        text = self._space + text
        kept = text.rstrip()
        self._space = text[len(kept) :]
        if kept:
            out.append(ReasoningDelta(kept))

    def _content(self, text: str, out: list[Delta]) -> None:
        if self._skip_space:
            text = text.lstrip()
            if not text:
                return
            self._skip_space = False
        if text:
            out.append(ContentDelta(text))


def partial_suffix(text: str, *markers: str) -> int:
    """The length of the longest end of `text` that is a proper beginning of one of `markers`."""
    for n in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        if any(len(m) > n and m.startswith(text[-n:]) for m in markers):
            return n
    return 0


def merged(deltas: list[Delta]) -> list[Delta]:
    """Neighbours of one kind as one delta."""
    out: list[Delta] = []
    for delta in deltas:
        if out and type(out[-1]) is type(delta):
            out[-1] = type(delta)(out[-1].text + delta.text)
        else:
            out.append(delta)
    return out
