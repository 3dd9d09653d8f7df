"""The parsers by name, and the pieces they share."""

from __future__ import annotations

import pytest

from router.tool_calls.common import call_from_object, json_term, partial_marker
from router.tool_calls.registry import TOOL_PARSERS, tool_parser
from router.tool_calls.types import ToolCall


def test_names_are_vllm_names():
    assert set(TOOL_PARSERS) == {"hermes", "llama3_json", "mistral", "openai", "pythonic",
                                 "qwen3_coder", "qwen3_xml", "ernie45", "glm45", "glm47",
                                 "minimax_m2", "seed_oss",
                                 "deepseek_v3", "deepseek_v31", "deepseek_v32", "kimi_k2",
                                 "llama4_pythonic",
                                 "llama4_json", "granite", "phi4_mini_json", "hunyuan_a13b",
                                 "olmo3"}  # fmt: skip
    for name, parser in TOOL_PARSERS.items():
        assert tool_parser(name).name == name
        assert isinstance(parser.markers, tuple)


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match="one of: deepseek_v3, deepseek_v31, deepseek_v32, "):
        tool_parser("nope")


@pytest.mark.parametrize(
    ("text", "held"),
    [("abc", 0), ("abc<", 1), ("abc<tool_c", 7), ("<tool_call>", 0), ("x[TOOL", 5), ("", 0)],
)
def test_partial_marker(text, held):
    assert partial_marker(text, ("<tool_call>", "[TOOL_CALLS]")) == held


@pytest.mark.parametrize(
    ("obj", "call"),
    [
        ({"name": "f", "arguments": {"a": "é"}}, ToolCall("f", '{"a": "é"}')),
        ({"name": "f"}, ToolCall("f", "{}")),
        ({"name": "f", "arguments": None}, None),
        ({"name": "", "arguments": {}}, None),
        ({"name": ["f"], "arguments": {}}, None),
        (["f"], None),
    ],
)
def test_call_from_object(obj, call):
    assert call_from_object(obj) == call


def test_json_term_of_no_schema_is_any_object():
    assert json_term({}).startswith('%json {"type": "object", ')
    assert json_term(None, default={}).startswith('%json {"x-guidance"')
