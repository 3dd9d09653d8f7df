"""What the parsers' tests share: a stream run over given fragments, checked against `parse` of
the whole text, and the hypothesis strategy for where a text is cut."""

from __future__ import annotations

from hypothesis import strategies as st

from router.tool_calls.types import CallDelta, TextDelta, ToolCall, ToolParser


def run_stream(parser: ToolParser, fragments: list[str]) -> tuple[str, list[ToolCall]]:
    """The content and calls a stream tells for `fragments`, with the deltas' own rules checked:
    no content delta that is only whitespace, calls numbered in order, each named once first."""
    stream = parser.stream()
    deltas = [d for fragment in fragments for d in stream.push(fragment)] + stream.finish()
    text: list[str] = []
    names: list[str] = []
    arguments: list[str] = []
    ids: list[str | None] = []
    for delta in deltas:
        if isinstance(delta, TextDelta):
            assert delta.text.strip(), f"a whitespace-only content delta: {deltas}"
            text.append(delta.text)
            continue
        assert isinstance(delta, CallDelta)
        if delta.name is not None:
            assert delta.index == len(names), deltas
            names.append(delta.name)
            arguments.append(delta.arguments)
            ids.append(delta.id)
        else:
            assert delta.index == len(names) - 1 and delta.id is None, deltas
            arguments[delta.index] += delta.arguments
    calls = [ToolCall(*call) for call in zip(names, arguments, ids, strict=True)]
    return "".join(text), calls


def check_stream(parser: ToolParser, text: str, fragments: list[str]) -> None:
    """A streamed answer tells what `parse` finds in the whole (content up to the whitespace
    around it)."""
    assert "".join(fragments) == text
    whole = parser.parse(text)
    content, calls = run_stream(parser, fragments)
    assert calls == whole.calls
    assert content == (whole.content or "").strip()


def cut(text: str, points: list[int]) -> list[str]:
    bounds = [0, *sorted(set(points)), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def check_all_splits(parser: ToolParser, text: str) -> None:
    """One character at a time, whole, and cut everywhere into two."""
    check_stream(parser, text, list(text))
    check_stream(parser, text, [text])
    for i in range(1, len(text)):
        check_stream(parser, text, [text[:i], text[i:]])


def cut_points(text: str) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, len(text)), max_size=8)
