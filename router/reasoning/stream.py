"""What the reasoning streams share: text taken apart a step at a time, with the tail that may
still become a marker held back until more text decides it."""

from __future__ import annotations

from router.reasoning.types import ContentDelta, ReasoningDelta, ReasoningStream, Split

Delta = ReasoningDelta | ContentDelta


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


def partial_suffix(text: str, *markers: str) -> int:
    """The length of the longest end of `text` that is a proper beginning of one of `markers`."""
    for n in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        if any(len(m) > n and m.startswith(text[-n:]) for m in markers):
            return n
    return 0


def first_of(text: str, markers: tuple[str, ...]) -> tuple[int, str | None]:
    """Where the first of `markers` occurs in `text`, and which (None: none does)."""
    found = [(at, m) for m in markers if (at := text.find(m)) >= 0]
    return min(found) if found else (-1, None)


def merged(deltas: list[Delta]) -> list[Delta]:
    """Neighbours of one kind as one delta."""
    out: list[Delta] = []
    for delta in deltas:
        if out and type(out[-1]) is type(delta):
            out[-1] = type(delta)(out[-1].text + delta.text)
        else:
            out.append(delta)
    return out


def run(stream: ReasoningStream, text: str) -> Split:
    """A whole answer through a stream, its deltas joined: for parsers whose `parse` is their
    stream, and for content stages."""
    deltas = [*stream.push(text), *stream.finish()]
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    return Split(reasoning or None, content or None)
