"""The reasoning parsers of the families beyond the first think blocks (vLLM's names): each
family's own layout and its edge cases (no markers, an unclosed block, markers only, text after
the answer), whole and streamed at every split point."""

from __future__ import annotations

import pytest

from router.reasoning.content import AnswerTags, Placeholder
from router.reasoning.registry import reasoning_parser
from router.reasoning.stream import run
from router.reasoning.types import ContentDelta, ReasoningDelta, Split
from tests.router.reasoning.test_reasoning_parsers import streamed

GRANITE_THINK, GRANITE_ANSWER = "Here is my thought process:", "Here is my response:"

CASES = [
    # Granite 3.x: plain-text phrases ("Here's" too), content without them.
    ("granite", False, f"{GRANITE_THINK}\nR\n\n{GRANITE_ANSWER}\nC", Split("R", "C")),
    ("granite", False, "Here's my thought process: R Here's my response: C", Split("R", "C")),
    ("granite", False, f"  {GRANITE_THINK} R Here's my response: C", Split("R", "C")),
    ("granite", False, "Paris is sunny.", Split(None, "Paris is sunny.")),
    ("granite", False, "Here is the forecast: sun.", Split(None, "Here is the forecast: sun.")),
    ("granite", False, f"{GRANITE_ANSWER} C", Split(None, f"{GRANITE_ANSWER} C")),
    ("granite", False, f"{GRANITE_THINK} still thinking", Split("still thinking", None)),
    ("granite", False, f"{GRANITE_THINK}{GRANITE_ANSWER}", Split(None, None)),
    (
        "granite",
        False,
        f"{GRANITE_THINK} R {GRANITE_ANSWER} C {GRANITE_ANSWER} D",
        Split("R", f"C {GRANITE_ANSWER} D"),
    ),
    # Hunyuan-A13B: a think block, then the answer in its tags.
    ("hunyuan_a13b", False, "<think>\nR\n</think>\n<answer>\nC\n</answer>", Split("R", "C")),
    ("hunyuan_a13b", False, "<think>\n\n</think>\n<answer>\nC\n</answer>", Split(None, "C")),
    ("hunyuan_a13b", False, "<answer>\nC\n</answer>", Split(None, "C")),
    ("hunyuan_a13b", False, "Just text.", Split(None, "Just text.")),
    ("hunyuan_a13b", False, "<think>\nR", Split("R", None)),
    ("hunyuan_a13b", False, "<think>R</think>\n<answer>\nC\nD", Split("R", "C\nD")),
    ("hunyuan_a13b", False, "<think>R</think>C", Split("R", "C")),
    ("hunyuan_a13b", False, "<think></think><answer></answer>", Split(None, None)),
    ("hunyuan_a13b", False, "<think>R</think><answer>C</answer> P.S.\n", Split("R", "C P.S.")),
    ("hunyuan_a13b", False, "<think>R</think><answer>C</ans", Split("R", "C</ans")),
    # ERNIE 4.5 Thinking: reasoning first, the answer maybe in `<response>` tags.
    ("ernie45", True, "R\n</think>\n\n<response>\nC\n</response>\n", Split("R", "C")),
    ("ernie45", True, "R</think>C", Split("R", "C")),
    ("ernie45", False, "<think>R</think>C", Split("R", "C")),
    ("ernie45", False, "no markers", Split("no markers", None)),
    ("ernie45", True, "R\nstill", Split("R\nstill", None)),
    ("ernie45", True, "</think><response></response>", Split(None, None)),
    ("ernie45", True, "R</think><response>C</response>tail", Split("R", "Ctail")),
    ("ernie45", True, "R</think><response>\nC", Split("R", "C")),
    # Olmo 3 Think: the template opened the block (plain text); reasoning up to `</think>`.
    ("olmo3", False, "R</think>C", Split("R", "C")),
    ("olmo3", False, "<think>\nR\n</think>\n\nC", Split("R", "C")),
    ("olmo3", False, "still thinking", Split("still thinking", None)),
    ("olmo3", False, "</think>", Split(None, None)),
    ("olmo3", False, "R</think>C</think>D", Split("R", "C</think>D")),
    # Magistral: `[THINK]` tokens, the model opens the block itself or answers straight away.
    ("mistral", False, "[THINK]R[/THINK]C", Split("R", "C")),
    ("mistral", False, "\n[THINK]\nR\n[/THINK]\n\nC", Split("R", "C")),
    ("mistral", False, "Straight answer.", Split(None, "Straight answer.")),
    ("mistral", False, "[THINK]R", Split("R", None)),
    ("mistral", False, "[THINK][/THINK]", Split(None, None)),
    ("mistral", False, "[/THINK]C", Split(None, "[/THINK]C")),  # no opening: all content
    ("mistral", False, "[THINK]R[/THINK]C[THINK]D", Split("R", "C[THINK]D")),
    # Kimi K2: reasoning first; its placeholder is no content.
    ("kimi_k2", False, "<think>R</think>C", Split("R", "C")),
    (
        "kimi_k2",
        True,
        "R</think>(no content)<|tool_calls_section_begin|>",
        Split("R", "<|tool_calls_section_begin|>"),
    ),
    ("kimi_k2", True, "R</think>\n(no content)\n", Split("R", None)),
    ("kimi_k2", True, "R</think>A (no content) B", Split("R", "A  B")),
    ("kimi_k2", True, "R</think>A (no con", Split("R", "A (no con")),
    ("kimi_k2", True, "no markers", Split("no markers", None)),
    ("kimi_k2", True, "</think>", Split(None, None)),
    # DeepSeek-V3.1: thinking on opens the block in the prompt; off writes none.
    ("deepseek_v3", True, "R\n</think>\n\nC", Split("R", "C")),
    ("deepseek_v3", False, "C", Split(None, "C")),
    ("deepseek_v3", False, "<think>R</think>C", Split("R", "C")),
    ("deepseek_v3", True, "R", Split("R", None)),
    ("deepseek_v3", True, "</think>", Split(None, None)),
    ("deepseek_v3", True, "R</think>C</think>D", Split("R", "C</think>D")),
    # Step3: the template opens the block; reasoning up to `</think>`.
    ("step3", True, "R\n</think>\nC", Split("R", "C")),
    ("step3", False, "R</think>C", Split("R", "C")),
    ("step3", True, "no markers", Split("no markers", None)),
    ("step3", True, "</think>\n", Split(None, None)),
    # MiniMax-M2, the block kept in the content: `<think>` put back where the prompt opened it.
    (
        "minimax_m2_append_think",
        True,
        "R\n</think>\n\nC",
        Split(None, "<think>R\n</think>\n\nC"),
    ),
    ("minimax_m2_append_think", False, "<think>R</think>C", Split(None, "<think>R</think>C")),
    ("minimax_m2_append_think", True, "R", Split(None, "<think>R")),
    ("minimax_m2_append_think", True, "</think>", Split(None, "<think></think>")),
]


@pytest.mark.parametrize(("name", "opened", "text", "split"), CASES)
def test_whole_and_streamed_at_every_split(name: str, opened: bool, text: str, split: Split):
    parser = reasoning_parser(name)
    assert parser.parse(text, opened) == split
    assert streamed(parser, [text], opened) == split
    assert streamed(parser, list(text), opened) == split
    for i in range(len(text) + 1):
        assert streamed(parser, [text[:i], text[i:]], opened) == split, i


def test_reasoning_streams_before_the_marker_comes() -> None:
    """Plain-text markers are held only while they may still be one: reasoning goes out as it
    comes, a phrase that is not the marker after all too."""
    stream = reasoning_parser("granite").stream(False)
    assert stream.push("Here is my thought") == []  # may still open the block
    assert stream.push(" process: plan. Here is my") == [ReasoningDelta("plan.")]
    assert stream.push(" plan B. Here") == [ReasoningDelta(" Here is my plan B.")]
    assert stream.push("'s my response: Go.") == [ContentDelta("Go.")]
    assert stream.finish() == []
    stream = reasoning_parser("hunyuan_a13b").stream(False)
    assert stream.push("<think>\nR\n</think>\n<ans") == [ReasoningDelta("R")]
    assert stream.push("wer>\nC\n</ans") == [ContentDelta("C")]
    assert stream.push("wer>") == []
    assert stream.finish() == []


def test_content_stages() -> None:
    assert run(AnswerTags("<a>", "</a>"), " <a> x </a> y ") == Split(None, "x y")
    assert run(AnswerTags("<a>", "</a>"), "x <a> y") == Split(None, "x <a> y")  # not at start
    assert run(AnswerTags("<a>", "</a>"), "<a>\n\n</a>\n") == Split(None, None)
    assert run(Placeholder("(none)"), "(none)(none) a(none)b ") == Split(None, "ab ")
    stream = Placeholder("(none)")
    assert stream.push("a (no") == [ContentDelta("a ")]
    assert stream.push("ne) b") == [ContentDelta(" b")]


@pytest.mark.parametrize(
    ("name", "markers", "gated"),
    [
        ("granite", (), False),
        ("hunyuan_a13b", (), False),
        ("olmo3", (), False),
        ("mistral", ("[THINK]", "[/THINK]"), True),
        ("ernie45", ("<think>", "</think>"), True),
        ("kimi_k2", ("<think>", "</think>"), True),
        ("deepseek_v3", ("<think>", "</think>"), True),
        ("step3", ("<think>", "</think>"), True),
        ("minimax_m2_append_think", ("<think>", "</think>"), True),
    ],
)
def test_markers_checked_at_startup(name: str, markers: tuple[str, ...], gated: bool) -> None:
    """Markers that are tokens must be single tokens of the vocabulary (and gate a grammar);
    plain-text markers leave nothing to check, and a grammar holds from the first token."""
    parser = reasoning_parser(name)
    assert (parser.markers, parser.gated) == (markers, gated)
