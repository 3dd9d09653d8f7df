"""The cases of the Llama 4, Granite, Phi-4-mini, Hunyuan-A13B and Olmo 3 parsers, checked as
test_tool_parser_cases checks the others: parsed whole, malformed ones kept as text, and
streamed cut at every point and at random points into the same result."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.tool_calls.types import Parsed
from tests.router.tool_calls import (
    test_tool_parser_granite,
    test_tool_parser_hunyuan_a13b,
    test_tool_parser_llama4,
    test_tool_parser_olmo3,
    test_tool_parser_phi4_mini_json,
)
from tests.router.tool_calls.checks import check_all_splits, check_stream, cut, cut_points

FORMATS = [test_tool_parser_llama4, test_tool_parser_granite, test_tool_parser_phi4_mini_json,
           test_tool_parser_hunyuan_a13b, test_tool_parser_olmo3]  # fmt: skip
WHOLE = [(f.PARSER, text, expected) for f in FORMATS for text, expected in f.WHOLE]
MALFORMED = [(f.PARSER, text) for f in FORMATS for text in f.MALFORMED]
EVERY = [(parser, text) for parser, text, _ in WHOLE] + MALFORMED


@pytest.mark.parametrize(("parser", "text", "expected"), WHOLE)
def test_new_formats_parse_whole(parser, text, expected):
    assert parser.parse(text) == expected


@pytest.mark.parametrize(("parser", "text"), MALFORMED)
def test_new_formats_malformed_stays_text(parser, text):
    assert parser.parse(text) == Parsed(text, [])


@pytest.mark.parametrize(("parser", "text"), EVERY)
def test_new_formats_stream_every_split(parser, text):
    check_all_splits(parser, text)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), case=st.sampled_from(EVERY))
def test_new_formats_stream_random_splits(data, case):
    parser, text = case
    check_stream(parser, text, cut(text, data.draw(cut_points(text))))
