"""The think-block parsers: whole answers, and streams cut anywhere giving the same split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.reasoning.parsers import (
    DeepSeekR1Parser,
    Glm45Parser,
    MiniMaxM2Parser,
    Qwen3Parser,
    SeedOssParser,
    ThinkParser,
)
from router.reasoning.registry import REASONING_PARSERS, reasoning_parser
from router.reasoning.types import ContentDelta, ReasoningDelta, Split

R1, QWEN = DeepSeekR1Parser(), Qwen3Parser()
GLM, MINIMAX, SEED = Glm45Parser(), MiniMaxM2Parser(), SeedOssParser()


@pytest.mark.parametrize(
    ("parser", "text", "opened", "split"),
    [
        # Qwen3's own layout: whitespace around the markers goes.
        (QWEN, "<think>\nhmm\n</think>\n\nHi.", False, Split("hmm", "Hi.")),
        (QWEN, "  <think>a</think>b", False, Split("a", "b")),
        (QWEN, "Hi there.", False, Split(None, "Hi there.")),  # enable_thinking=false
        (QWEN, "a</think>b", False, Split(None, "a</think>b")),  # no opening: all content
        (QWEN, "<think>\nstill thinking", False, Split("still thinking", None)),  # cut off
        (QWEN, "<think>\n\n</think>\n\nHi.", False, Split(None, "Hi.")),  # empty block
        (QWEN, "a\n</think>\nb", True, Split("a", "b")),  # the prompt opened it
        (QWEN, "", False, Split(None, None)),
        # DeepSeek-R1: the template opens the block; the model closes it.
        (R1, "thinking\n</think>\n\nAnswer", True, Split("thinking", "Answer")),
        (R1, "cut off", True, Split("cut off", None)),
        (R1, "<think>x</think>y", False, Split("x", "y")),
        (R1, "x</think>y", False, Split("x", "y")),  # the opening tag left out
        (R1, "no markers", False, Split("no markers", None)),  # vLLM's reading for R1
        (R1, "\n<think>\nx", False, Split("x", None)),
        (R1, "</think>answer", False, Split(None, "answer")),
        # Only the first end marker ends reasoning; later markers are content.
        (R1, "a</think>b</think><think>c", True, Split("a", "b</think><think>c")),
        # Trailing whitespace of content stays; inner whitespace of reasoning stays.
        (R1, " a \n b </think> c \n", True, Split("a \n b", "c \n")),
        # GLM-4.5 writes its block when it thinks (its template closes an empty one when not).
        (GLM, "<think>plan</think>Answer", False, Split("plan", "Answer")),
        (GLM, "Answer", False, Split(None, "Answer")),
        # MiniMax-M2's answers start inside the block its template opened, or not.
        (MINIMAX, "plan\n</think>\n\nAnswer", True, Split("plan", "Answer")),
        (MINIMAX, "plan</think>Answer", False, Split("plan", "Answer")),
        (MINIMAX, "<think>plan</think>Answer", False, Split("plan", "Answer")),
        # Seed-OSS's own markers; `<think>` is text to it.
        (SEED, "<seed:think>a <think> b</seed:think>Hi", False, Split("a <think> b", "Hi")),
        (SEED, "a</seed:think>Hi", False, Split("a", "Hi")),
        (SEED, "<think>a</think>b", False, Split("<think>a</think>b", None)),
    ],
)
def test_parse(parser: ThinkParser, text: str, opened: bool, split: Split) -> None:
    assert parser.parse(text, opened) == split
    assert streamed(parser, [text], opened) == split


def streamed(parser: ThinkParser, pieces: list[str], opened: bool) -> Split:
    stream = parser.stream(opened)
    deltas = [d for piece in pieces for d in stream.push(piece)] + stream.finish()
    assert all(d.text for d in deltas), deltas  # never an empty delta
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    # Reasoning never comes after content.
    kinds = [type(d) for d in deltas]
    if ContentDelta in kinds:
        assert ReasoningDelta not in kinds[kinds.index(ContentDelta) :]
    return Split(reasoning or None, content or None)


def test_marker_split_across_pushes() -> None:
    stream = R1.stream(opened=True)
    assert stream.push("thought </th") == [ReasoningDelta("thought")]
    assert stream.push("ink>") == []
    assert stream.push("  answer") == [ContentDelta("answer")]
    assert stream.finish() == []


def test_not_a_marker_after_all() -> None:
    stream = R1.stream(opened=True)
    assert stream.push("a </th") == [ReasoningDelta("a")]
    assert stream.push("ese") == [ReasoningDelta(" </these")]


def test_qwen3_holds_the_lead_until_decided() -> None:
    stream = QWEN.stream(opened=False)
    assert stream.push(" <thi") == []
    assert stream.push("s is content") == [ContentDelta(" <this is content")]
    stream = QWEN.stream(opened=False)
    assert stream.push("\n<thi") == []
    assert stream.push("nk>\nx") == [ReasoningDelta("x")]


def test_registry() -> None:
    assert set(REASONING_PARSERS) == {"deepseek_r1", "qwen3", "openai_gptoss", "glm45",
                                      "minimax_m2", "seed_oss", "deepseek_v3", "ernie45",
                                      "granite", "hunyuan_a13b", "kimi_k2",
                                      "minimax_m2_append_think", "mistral", "olmo3",
                                      "step3"}  # fmt: skip
    assert isinstance(reasoning_parser("qwen3"), Qwen3Parser)
    parser = reasoning_parser("deepseek_r1")
    assert (parser.name, parser.start, parser.end) == ("deepseek_r1", "<think>", "</think>")
    assert (SEED.markers, SEED.gated) == (("<seed:think>", "</seed:think>"), True)
    with pytest.raises(ValueError, match="deepseek_r1, deepseek_v3, ernie45, glm45, granite"):
        reasoning_parser("nope")


@pytest.mark.parametrize("name", sorted(REASONING_PARSERS))
def test_every_parser_keeps_the_contract(name: str) -> None:
    """What the startup check and the gate rely on (router/chat_features.py): a gated parser's
    `start` and `end` are among the markers checked as single tokens; markers are never empty
    text; an empty answer is neither reasoning nor content, whole or streamed."""
    parser = reasoning_parser(name)
    assert parser.name == name and all(parser.markers)
    if parser.gated:
        assert {parser.start, parser.end} <= set(parser.markers)
    for opened in (False, True):
        assert parser.parse("", opened) == Split(None, None)
        stream = parser.stream(opened)
        assert [*stream.push(""), *stream.finish()] == []


# Answers built from the pieces that matter: markers, their fragments, whitespace, text; and
# for each parser its own markers (all spellings), their halves, and what its content stage
# takes off (answer tags, placeholders).
_ATOMS = ["<think>", "</think>", "<th", "</th", "ink>", "<", "/", "k>", " ", "\n", "a", "b c", "é"]
_STAGED = ["<answer>", "</answer>", "<response>", "</response>", "(no content)", "(no", "nt)"]


def answers(parser) -> st.SearchStrategy[str]:
    own = [*getattr(parser, "starts", [parser.start]), *getattr(parser, "ends", [parser.end])]
    halves = [half for m in own for half in (m[: len(m) // 2], m[len(m) // 2 :])]
    atoms = [*_ATOMS, *own, *halves, *_STAGED]
    return st.lists(st.sampled_from(atoms), max_size=12).map("".join)


@st.composite
def cut(draw: st.DrawFn, text: str) -> list[str]:
    """`text` cut at random places (empty pieces included)."""
    points = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


# Every registered parser but harmony (tests/router/reasoning/test_reasoning_harmony.py).
THINKERS = [reasoning_parser(name) for name in sorted(REASONING_PARSERS) if name != "openai_gptoss"]


@pytest.mark.parametrize("opened", [False, True])
@pytest.mark.parametrize("parser", THINKERS, ids=lambda p: p.name)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_stream_equals_parse(parser: ThinkParser, opened: bool, data: st.DataObject) -> None:
    text = data.draw(answers(parser))
    pieces = data.draw(cut(text))
    assert streamed(parser, pieces, opened) == parser.parse(text, opened)
