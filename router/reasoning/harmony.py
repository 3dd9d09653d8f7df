"""gpt-oss's harmony format (`openai_gptoss`): the answer is a run of messages, each a header, a
body and a terminator, all markup special tokens:

    <|channel|>analysis<|message|>User asks X.<|end|>
    <|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>

(the first header follows the prompt's `<|start|>assistant`). The parser takes them apart:
`analysis` bodies are reasoning; `final` bodies, and commentary without a recipient (a preamble
before calls), are content; a message with a recipient (`to=functions.get_weather`, in the
header before or after the channel) is a tool call, passed on in the content in one canonical
form, `<|channel|>commentary to=functions.get_weather<|message|>{...}<|call|>`, which
`--tool-call-parser openai` reads (without it the call stays visible as content). Headers,
`<|start|>assistant` and terminators never reach reasoning or content; bodies are kept as written,
and several bodies of one kind are joined by a newline (as vLLM joins them).

An answer that does not open with markup (one written under a grammar, which constrains the
answer from its first token) is content as it is: read as the body of a final message.

`parse` is the stream over the whole text, so a whole answer and a streamed one split the same.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from router.reasoning.stream import Delta, SteppedStream, first_of, merged, partial_suffix, run
from router.reasoning.types import ContentDelta, ReasoningDelta, Split

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
# What ends a body: a terminator, or the next message's start where the terminator was left out.
_BODY_ENDS = (END, RETURN, CALL, START)
# Markup inside a body is no text of it (its tokens are special: the detokenizer drops them).
_STRAY = (MESSAGE, CHANNEL, CONSTRAIN)
# How a harmony answer opens (after whitespace): markup, or a recipient before the channel
# (`<|start|>assistant to=functions.f<|channel|>...`, the prompt having written the role).
_OPENERS = (*MARKERS, "to=")
_JOIN = "\n"

Kind = Literal["reasoning", "content", "call"]


def call_head(channel: str, recipient: str) -> str:
    """The canonical header of a message to `recipient` (what the tool-call parser reads)."""
    return f"{CHANNEL}{channel} to={recipient}{MESSAGE}"


class HarmonyParser:
    name: ClassVar[str] = "openai_gptoss"
    markers: ClassVar[tuple[str, ...]] = MARKERS
    # No think block to wait out: a grammar constrains the answer from its first token.
    gated: ClassVar[bool] = False

    def parse(self, text: str, opened: bool) -> Split:
        """`opened` does not apply: every answer opens its own messages."""
        return run(self.stream(opened), text)

    def stream(self, opened: bool) -> HarmonyStream:
        return HarmonyStream()


def read_header(header: str) -> tuple[str | None, str | None]:
    """A header's channel and recipient (None where it names none). It runs from the message's
    start (after `<|start|>`, or the answer's start) to `<|message|>`: the role, maybe
    `to=RECIPIENT`, then `<|channel|>CHANNEL`, maybe `to=RECIPIENT`, maybe a content type
    (`json`, `<|constrain|>json`)."""
    role, has_channel, rest = header.rpartition(START)[2].partition(CHANNEL)
    rest = rest.replace(CONSTRAIN, " ")
    words = role.split() + rest.split()
    recipient = next((w[3:] for w in words if w.startswith("to=") and len(w) > 3), None)
    channel = next((w for w in rest.split() if not w.startswith("to=")), None)
    return (channel if has_channel else None), recipient


def _kind(channel: str | None, recipient: str | None) -> Kind:
    if recipient is not None:
        return "call"
    return "reasoning" if channel == "analysis" else "content"


class HarmonyStream(SteppedStream):
    """One answer's text as it comes; held back: a header until its `<|message|>`, and a tail
    that may begin a marker."""

    def __init__(self) -> None:
        self._state: Literal["lead", "header", "body"] = "lead"
        self._buf = ""
        self._kind: Kind = "content"
        self._said = {"reasoning": False, "content": False}  # some text of the kind went out
        self._fresh = True  # the current body has given out nothing yet
        self._read = False  # some header was read (the answer is harmony)

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        text, self._buf = self._buf, ""
        if self._state == "lead":
            self._emit("content", text, out)
        elif self._state == "body":  # cut off (or no terminator): what was held is body text
            self._body(_unmarked(text), out)
            if self._kind == "call":
                out.append(ContentDelta(CALL))
        elif not self._read and not any(m in text for m in MARKERS):
            self._emit("content", text, out)  # "to=..." that never became a header: plain text
        # Else an unfinished header, which says nothing.
        self._state = "header"
        return merged(out)

    def _step(self, out: list[Delta]) -> bool:
        """Handles what it can of the buffer; False when the rest must wait for more text."""
        if self._state == "lead":
            lead = self._buf.lstrip()
            if any(lead.startswith(o) for o in _OPENERS):
                self._state = "header"
            elif not lead or any(o.startswith(lead) for o in _OPENERS):
                return False  # may still open with markup
            else:  # no header: content, as a final message's body
                self._state, self._kind = "body", "content"
            return True
        if self._state == "header":
            return self._header(out)
        at, marker = first_of(self._buf, _BODY_ENDS)
        if marker is None:
            keep = partial_suffix(self._buf, *MARKERS)
            self._body(_unmarked(self._buf[: len(self._buf) - keep]), out)
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        self._body(_unmarked(self._buf[:at]), out)
        if self._kind == "call":
            out.append(ContentDelta(CALL))
        # `<|start|>` opens the next header itself; a terminator goes.
        self._buf = self._buf[at:] if marker == START else self._buf[at + len(marker) :]
        self._state = "header"
        return True

    def _header(self, out: list[Delta]) -> bool:
        at, marker = first_of(self._buf, (MESSAGE, END, RETURN, CALL))
        if marker is None:
            return False  # headers are short: all of it waits for `<|message|>`
        if marker != MESSAGE:  # a message without a body: nothing to tell
            self._buf = self._buf[at + len(marker) :]
            return True
        channel, recipient = read_header(self._buf[:at])
        self._buf = self._buf[at + len(MESSAGE) :]
        self._kind, self._fresh, self._state = _kind(channel, recipient), True, "body"
        self._read = True
        if recipient is not None:
            out.append(ContentDelta(call_head(channel or "commentary", recipient)))
        return True

    def _body(self, text: str, out: list[Delta]) -> None:
        if self._kind == "call":
            if text:
                out.append(ContentDelta(text))
            return
        self._emit(self._kind, text, out)

    def _emit(self, kind: Literal["reasoning", "content"], text: str, out: list[Delta]) -> None:
        if not text:
            return
        if self._fresh and self._said[kind]:
            text = _JOIN + text  # the next message of a kind already told
        self._fresh, self._said[kind] = False, True
        out.append(ReasoningDelta(text) if kind == "reasoning" else ContentDelta(text))


def _unmarked(text: str) -> str:
    for marker in _STRAY:
        text = text.replace(marker, "")
    return text
