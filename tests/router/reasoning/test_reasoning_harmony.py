"""The harmony parser (`openai_gptoss`, gpt-oss): analysis to reasoning, final and preambles to
content, calls passed on in their canonical form; whole answers, and streams cut anywhere giving
the same split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.reasoning.harmony import MARKERS, HarmonyParser, read_header
from router.reasoning.registry import reasoning_parser
from router.reasoning.types import ContentDelta, ReasoningDelta, Split
from tests.router.reasoning.test_reasoning_parsers import cut

HARMONY = HarmonyParser()


def streamed(parser: HarmonyParser, pieces: list[str], opened: bool) -> Split:
    """What a stream tells for `pieces`, joined (reasoning may follow content here: a preamble
    before more analysis)."""
    stream = parser.stream(opened)
    deltas = [d for piece in pieces for d in stream.push(piece)] + stream.finish()
    assert all(d.text for d in deltas), deltas  # never an empty delta
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    return Split(reasoning or None, content or None)


ARGS = '{"city": "Paris"}'
CANONICAL = f"<|channel|>commentary to=functions.get_weather<|message|>{ARGS}<|call|>"

CASES = [
    # reasoning, then the final answer
    (
        "<|channel|>analysis<|message|>User asks X. Let's answer.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>",
        Split("User asks X. Let's answer.", "The answer is 4."),
    ),
    # reasoning, then a call (the recipient after the channel, a constrained content type)
    (
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>"
        f"commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}<|call|>",
        Split("Need weather.", CANONICAL),
    ),
    # the recipient in the header before the channel; the answer opens with it
    (
        f" to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}<|call|>",
        Split(None, CANONICAL),
    ),
    (
        "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant to=functions.get_weather"
        f"<|channel|>commentary json<|message|>{ARGS}<|call|>",
        Split("Hm.", CANONICAL),
    ),
    # a preamble, then a call
    (
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>"
        f"commentary to=functions.get_weather<|message|>{ARGS}<|call|>",
        Split(None, "Let me check." + CANONICAL),
    ),
    # two calls; a body that is not JSON is passed on all the same (the tool parser decides)
    (
        "<|channel|>commentary to=functions.a<|message|>{}<|call|>"
        "<|start|>assistant<|channel|>commentary to=functions.b<|message|>{bad<|call|>",
        Split(
            None,
            "<|channel|>commentary to=functions.a<|message|>{}<|call|>"
            "<|channel|>commentary to=functions.b<|message|>{bad<|call|>",
        ),
    ),
    # an empty analysis; two analysis messages and two content messages join with a newline
    (
        "<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>Hi",
        Split(None, "Hi"),
    ),
    (
        "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>"
        "b<|end|><|start|>assistant<|channel|>analysis<|message|>c<|end|>"
        "<|start|>assistant<|channel|>final<|message|>d<|return|>",
        Split("a\nc", "b\nd"),
    ),
    # no markup (an answer under a grammar): content as it is
    ('{"unit": "c", "days": 2}', Split(None, '{"unit": "c", "days": 2}')),
    ("  to the moon ", Split(None, "  to the moon ")),
    ("to=x, not a header", Split(None, "to=x, not a header")),
    ("", Split(None, None)),
    # cut off: in the reasoning, in a header, in a call (which still ends as a message)
    ("<|channel|>analysis<|message|>still thinking", Split("still thinking", None)),
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin", Split("x", None)),
    (
        '<|channel|>commentary to=functions.f<|message|>{"a":',
        Split(None, '<|channel|>commentary to=functions.f<|message|>{"a":<|call|>'),
    ),
    # a header without a channel is content; a terminator left out before the next message
    ("<|message|>plain", Split(None, "plain")),
    (
        "<|channel|>analysis<|message|>a<|start|>assistant<|channel|>final<|message|>b",
        Split("a", "b"),
    ),
    # markup inside a body is no text of it; whitespace of bodies is kept
    ("<|channel|>final<|message|> a<|channel|>b \n<|return|>", Split(None, " ab \n")),
]


@pytest.mark.parametrize(("text", "split"), CASES)
def test_parse_and_every_split(text: str, split: Split) -> None:
    assert HARMONY.parse(text, False) == split
    assert HARMONY.parse(text, True) == split  # `opened` does not apply
    assert streamed(HARMONY, [text], False) == split
    assert streamed(HARMONY, list(text), False) == split
    for i in range(len(text) + 1):
        assert streamed(HARMONY, [text[:i], text[i:]], False) == split, i


def test_a_partial_marker_is_held_at_a_chunk_end() -> None:
    stream = HARMONY.stream(False)
    assert stream.push("<|chan") == []
    assert stream.push("nel|>analysis<|mess") == []  # the header waits for `<|message|>`
    assert stream.push("age|>Think <|e") == [ReasoningDelta("Think ")]
    assert stream.push("nd|><|start|>assistant<|channel|>final<|message|>Four<|ret") == [
        ContentDelta("Four")
    ]
    assert stream.push("urn|>") == []
    assert stream.finish() == []
    stream = HARMONY.stream(False)
    assert stream.push("<|channel|>final<|message|>a <|") == [ContentDelta("a ")]
    assert stream.push("x") == [ContentDelta("<|x")]  # not a marker after all


def test_a_call_goes_out_as_it_is_written() -> None:
    """The canonical header as soon as the header is complete, the body as it comes: an
    enforced call's arguments can stream."""
    stream = HARMONY.stream(False)
    head = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>"
    assert stream.push(head) == [ContentDelta("<|channel|>commentary to=functions.f<|message|>")]
    assert stream.push('{"a": ') == [ContentDelta('{"a": ')]
    assert stream.push("1}<|call|>") == [ContentDelta("1}<|call|>")]


@pytest.mark.parametrize(
    ("header", "read"),
    [
        ("<|channel|>analysis", ("analysis", None)),
        ("<|start|>assistant<|channel|>final", ("final", None)),
        ("<|channel|>commentary to=functions.f <|constrain|>json", ("commentary", "functions.f")),
        (
            "<|start|>assistant to=functions.f<|channel|>commentary json",
            ("commentary", "functions.f"),
        ),
        (" to=python<|channel|>analysis", ("analysis", "python")),
        ("<|start|>assistant", (None, None)),
    ],
)
def test_read_header(header: str, read: tuple) -> None:
    assert read_header(header) == read


def test_registered_and_not_gated() -> None:
    parser = reasoning_parser("openai_gptoss")
    assert isinstance(parser, HarmonyParser) and not parser.gated
    assert set(parser.markers) == {
        "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
        "<|call|>",
    }  # fmt: skip


# Answers built from the pieces that matter: markers, their fragments, headers, text.
_ATOMS = [*MARKERS, "<|", "<|chan", "|>", "assistant", "analysis", "final", "commentary",
          " to=functions.f", " json", "to=", "a", " ", "\n", "é"]  # fmt: skip
answers = st.lists(st.sampled_from(_ATOMS), max_size=14).map("".join)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_stream_equals_parse(data: st.DataObject) -> None:
    text = data.draw(answers)
    pieces = data.draw(cut(text))
    split = HARMONY.parse(text, False)
    assert streamed(HARMONY, pieces, False) == split
    for part in (split.reasoning or "", split.content or ""):
        assert "<|start|>" not in part and "<|end|>" not in part and "<|return|>" not in part
