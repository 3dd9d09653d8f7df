"""The think-block parsers: `<think>…</think>` reasoning before the answer (DeepSeek-R1 and V3.1,
Qwen3, GLM-4.5, MiniMax-M2, ERNIE 4.5, Kimi K2, Step3; Seed-OSS's `<seed:think>…</seed:think>`,
Magistral's `[THINK]…[/THINK]`), the markers single tokens of the family's vocabulary.

They differ only where the answer does not begin with the opening tag: DeepSeek-R1 models
sometimes leave it out, and the templates of MiniMax-M2, Seed-OSS, ERNIE 4.5, Kimi K2 and Step3
open the block in the prompt (or their models leave it out), so those parsers read such an answer
as reasoning still (up to the closing tag, or all of it); Qwen3, GLM-4.5, Magistral and
DeepSeek-V3 write no block when they do not think, so those read it as content. (Where a template
closes an empty block at the prompt's end, thinking off, the answer is not parsed at all:
`gate.first_state`.)

Whitespace: reasoning is stripped at both ends (Qwen3 writes `<think>\\n…\\n</think>`), content is
stripped at its start only where it follows `</think>`. A stream gives the same text as `parse`
of the whole: it drops whitespace after a marker and holds back whitespace at the end of the
reasoning until more reasoning comes (dropped if `</think>` or the end comes first). A family
whose content has more to take off (answer tags, placeholders) names a `content_stage`
(router/reasoning/content.py) that the content passes through, whole or streamed.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from router.reasoning.content import AnswerTags, Placeholder
from router.reasoning.stream import Delta, SteppedStream, first_of, merged, partial_suffix, run
from router.reasoning.types import ContentDelta, ReasoningDelta, ReasoningStream, Split


class ThinkParser:
    """`<think>` reasoning `</think>` content; subclasses say what an answer without the opening
    tag is (`optional`: content, else reasoning)."""

    name: ClassVar[str]
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    # Other ways the model writes `start` and `end` (Granite's "Here's" for "Here is").
    start_forms: ClassVar[tuple[str, ...]] = ()
    end_forms: ClassVar[tuple[str, ...]] = ()
    markers: ClassVar[tuple[str, ...]] = (start, end)
    gated: ClassVar[bool] = True
    optional: ClassVar[bool]  # the answer thinks only if it begins with `start`

    @property
    def starts(self) -> tuple[str, ...]:
        return (self.start, *self.start_forms)

    @property
    def ends(self) -> tuple[str, ...]:
        return (self.end, *self.end_forms)

    def content_stage(self) -> ReasoningStream | None:
        """What the content passes through after the split (None: it is told as it is)."""
        return None

    def parse(self, text: str, opened: bool) -> Split:
        body = text
        if not opened:
            lead = text.lstrip()
            opener = next((s for s in self.starts if lead.startswith(s)), None)
            if opener is not None:
                body = lead[len(opener) :]
            elif self.optional:
                return Split(None, self._content(text))
        at, end = first_of(body, self.ends)
        if end is None:
            return Split(body.strip() or None, None)
        content = body[at + len(end) :].lstrip()
        return Split(body[:at].strip() or None, self._content(content))

    def _content(self, text: str) -> str | None:
        stage = self.content_stage()
        return run(stage, text).content if stage is not None else text or None

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


class MistralParser(ThinkParser):
    """Magistral (2509 on): the model opens `[THINK]` itself when its system prompt asks it to
    think, and answers straight away otherwise."""

    name = "mistral"
    start = "[THINK]"
    end = "[/THINK]"
    markers = (start, end)
    optional = True


class DeepSeekV3Parser(ThinkParser):
    """DeepSeek-V3.1 and later: the template's `thinking` kwarg ends the prompt with `<think>`
    (reasoning) or `</think>` (none); a model without the toggle (V3-0324) writes no block."""

    name = "deepseek_v3"
    optional = True


class Step3Parser(ThinkParser):
    """Step3: its template ends the prompt with `<think>\\n`; the answer reasons up to
    `</think>`."""

    name = "step3"
    optional = False


class Ernie45Parser(ThinkParser):
    """ERNIE-4.5 Thinking: `…</think>` then the answer, maybe in `<response>…</response>`."""

    name = "ernie45"
    optional = False

    def content_stage(self) -> ReasoningStream:
        return AnswerTags("<response>", "</response>")


class KimiK2Parser(ThinkParser):
    """Kimi K2 (Thinking): reasoning first (unless the template closed the block: thinking off);
    its `(no content)` placeholder before calls is no content."""

    name = "kimi_k2"
    optional = False

    def content_stage(self) -> ReasoningStream:
        return Placeholder("(no content)")


State = Literal["lead", "reasoning", "content"]


class ThinkStream(SteppedStream):
    """One answer's text as it comes, taken apart as `ThinkParser.parse` takes the whole."""

    def __init__(self, parser: ThinkParser, opened: bool) -> None:
        self._parser = parser
        self._starts, self._ends = parser.starts, parser.ends
        self._stage = parser.content_stage()
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
        if self._stage is not None:
            out += self._stage.finish()
        return merged(out)

    def _step(self, out: list[Delta]) -> bool:
        """Handles what it can of the buffer; False when the rest must wait for more text."""
        if self._state == "lead":
            lead = self._buf.lstrip()
            opener = next((s for s in self._starts if lead.startswith(s)), None)
            if opener is not None:
                self._buf, self._state = lead[len(opener) :], "reasoning"
            elif any(s.startswith(lead) for s in self._starts):
                return False  # "  <thi": may still become the opening tag
            else:
                self._state = "content" if self._parser.optional else "reasoning"
            return True
        if self._state == "reasoning":
            at, end = first_of(self._buf, self._ends)
            if end is not None:
                self._reason(self._buf[:at], out)
                self._buf, self._state = self._buf[at + len(end) :], "content"
                self._space, self._skip_space = "", True
                return True
            keep = partial_suffix(self._buf, *self._ends)
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
        if not text:
            return
        if self._stage is not None:
            out += self._stage.push(text)
        else:
            out.append(ContentDelta(text))
