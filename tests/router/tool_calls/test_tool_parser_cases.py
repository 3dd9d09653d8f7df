"""What every tool-call parser must do with its format's cases (each parser's file lists them:
WHOLE, answers with what parse() finds; MALFORMED, answers that must stay text): parse them,
and stream them cut at every point and at random points into the same result."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.tool_calls.types import Parsed
from tests.router.tool_calls import (
    test_tool_parser_deepseek_v3,
    test_tool_parser_deepseek_v31,
    test_tool_parser_deepseek_v32,
    test_tool_parser_glm45,
    test_tool_parser_hermes,
    test_tool_parser_kimi_k2,
    test_tool_parser_llama3_json,
    test_tool_parser_minimax_m2,
    test_tool_parser_mistral,
    test_tool_parser_pythonic,
    test_tool_parser_qwen3_coder,
    test_tool_parser_seed_oss,
)
from tests.router.tool_calls.checks import check_all_splits, check_stream, cut, cut_points

FORMATS = [test_tool_parser_hermes, test_tool_parser_llama3_json, test_tool_parser_mistral,
           test_tool_parser_pythonic, test_tool_parser_qwen3_coder, test_tool_parser_glm45,
           test_tool_parser_minimax_m2, test_tool_parser_seed_oss, test_tool_parser_deepseek_v3,
           test_tool_parser_deepseek_v31, test_tool_parser_deepseek_v32,
           test_tool_parser_kimi_k2]  # fmt: skip
WHOLE = [(f.PARSER, text, expected) for f in FORMATS for text, expected in f.WHOLE]
MALFORMED = [(f.PARSER, text) for f in FORMATS for text in f.MALFORMED]
EVERY = [(parser, text) for parser, text, _ in WHOLE] + MALFORMED


@pytest.mark.parametrize(("parser", "text", "expected"), WHOLE)
def test_parse_whole(parser, text, expected):
    assert parser.parse(text) == expected


@pytest.mark.parametrize(("parser", "text"), MALFORMED)
def test_malformed_stays_text(parser, text):
    assert parser.parse(text) == Parsed(text, [])


@pytest.mark.parametrize(("parser", "text"), EVERY)
def test_stream_every_split(parser, text):
    check_all_splits(parser, text)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), case=st.sampled_from(EVERY))
def test_stream_random_splits(data, case):
    parser, text = case
    check_stream(parser, text, cut(text, data.draw(cut_points(text))))
