"""How the XML formats read a parameter's text back, by its schema."""

from __future__ import annotations

import pytest

from router.tool_calls.qwen3_coder import Qwen3CoderParser
from router.tool_calls.registry import tool_parser
from router.tool_calls.types import Tool
from router.tool_calls.xml_values import argument_value, resolved, value_kind

NULLABLE_STRING = {"anyOf": [{"type": "string"}, {"type": "null"}]}


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        ("  keep\n spaces ", {"type": "string"}, "  keep\n spaces "),
        ("42", {"type": "string"}, "42"),
        ("null", {"type": "string"}, "null"),  # a plain string keeps the word
        ("null", NULLABLE_STRING, None),
        ("None", {"type": ["string", "null"]}, None),
        ("c", {"enum": ["c", "f"]}, "c"),
        ("42", None, "42"),  # untyped: a string
        ("42", {"description": "no type"}, "42"),
        ("42", {"type": "integer"}, 42),
        (" 2.5\n", {"type": "number"}, 2.5),
        ("True", {"type": "boolean"}, True),
        ("false", {"type": "boolean"}, False),
        ("None", {"type": "integer"}, None),
        ("{'k': [1, 'a']}", {"type": "object"}, {"k": [1, "a"]}),  # Python's repr of a dict
        ('{"k": null}', {"type": "object"}, {"k": None}),
        ("[1, 2]", {"type": "array"}, [1, 2]),
        ("twelve", {"type": "integer"}, "twelve"),  # botched: the text, not dropped
        ("(1, 2)", {"type": "array"}, "(1, 2)"),  # a tuple is no JSON value
        ("NaN", {"type": "number"}, "NaN"),
        ("1", {"enum": [1, 2]}, 1),
        ("3", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, 3),
    ],
)
def test_argument_value(text, schema, value):
    assert argument_value(text, schema) == value
    assert type(argument_value(text, schema)) is type(value)


def test_local_references_resolve():
    root = {"$defs": {"unit": {"enum": ["c", "f"]}}, "definitions": {"n": {"type": "integer"}}}
    assert value_kind(resolved({"$ref": "#/$defs/unit"}, root)) == "string"
    assert argument_value("7", resolved({"$ref": "#/definitions/n"}, root)) == 7
    assert resolved({"$ref": "#/$defs/missing"}, root) == {"$ref": "#/$defs/missing"}
    cycle = {"$defs": {"a": {"$ref": "#/$defs/a"}}}
    assert resolved({"$ref": "#/$defs/a"}, cycle) == {"$ref": "#/$defs/a"}


def test_values_are_strings_without_the_requests_tools():
    text = "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>"
    assert Qwen3CoderParser().parse(text).calls[0].arguments == '{"n": "3"}'
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    typed = Qwen3CoderParser().for_tools([Tool("f", None, schema)])
    assert typed.parse(text).calls[0].arguments == '{"n": 3}'


@pytest.mark.parametrize("name", ["qwen3_coder", "glm45", "minimax_m2", "seed_oss"])
@pytest.mark.parametrize("word", ["pattern", "format"])
def test_a_string_constraint_the_format_cannot_enforce_is_refused(name, word):
    schema = {"type": "object", "properties": {"day": {"type": "string", word: "date"}}}
    with pytest.raises(ValueError, match=f"parameter 'day': a string's `{word}`"):
        tool_parser(name).grammar([Tool("f", None, schema)], False, lambda text: f'"{text}"')
