"""The values of the XML call formats' parameters (Qwen3-Coder, GLM-4.5, MiniMax-M2, Seed-OSS).

Their templates write each argument as text between tags: a string as it is, anything else as
JSON (or, in Qwen3-Coder's template, Python's `str` of it: `True`, `None`). Only the tool's
schema says which a value was, so the parameter's schema decides how the text is read back, as
vLLM's parsers read it:
- a string parameter (`type` string, an enum of strings, or a union of strings and null) keeps
  its text exactly, whitespace inside included: code the model writes keeps its indentation. A
  nullable one reads `null` (or `None`) as null.
- any other typed parameter is JSON, or a Python literal where the text is one (`True`,
  `{'k': 1}`), or, where it is neither, the text as a string: a value the model botched stays
  visible to the caller rather than dropped.
- a parameter the schema does not type (or does not name) is a string.
"""

from __future__ import annotations

import ast
from typing import Any, Literal

from router.tool_calls.common import DECODER

Kind = Literal["string", "json"]
_PYTHON_NAMES = {"True": True, "False": False, "None": None}
_NULLS = ("null", "None")


def resolved(schema: Any, root: Any) -> Any:
    """`schema` with a local `$ref` (`#/$defs/…`, `#/definitions/…`) into `root` followed."""
    for _ in range(8):  # a chain of references, not a cycle
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(ref, str) or not ref.startswith("#/") or not isinstance(root, dict):
            return schema
        found: Any = root
        for part in ref[2:].split("/"):
            found = found.get(part) if isinstance(found, dict) else None
        if not isinstance(found, dict):
            return schema
        schema = {**found, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def value_kind(schema: Any) -> Kind:
    """How a parameter's text is read: "string" (as written) or "json"."""
    if not isinstance(schema, dict) or not schema:
        return "string"
    for key in ("enum", "const"):
        if key in schema:
            values = schema[key] if key == "enum" else [schema[key]]
            if isinstance(values, list) and all(isinstance(v, str) for v in values):
                return "string"
            return "json"
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return "string" if [t for t in types if t != "null"] == ["string"] else "json"
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            options = [o for o in schema[key] if not _is_null(o)]
            if options and all(value_kind(o) == "string" for o in options):
                return "string"
            return "json"
    if any(key in schema for key in ("properties", "items", "allOf", "$ref")):
        return "json"
    return "string"


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"


def nullable(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    types = schema.get("type")
    if types == "null" or (isinstance(types, list) and "null" in types):
        return True
    options = [*schema.get("anyOf", []), *schema.get("oneOf", [])]
    return any(map(_is_null, options))


def argument_value(text: str, schema: Any) -> Any:
    """The JSON value of a parameter written as `text`, given its schema (None: untyped)."""
    if value_kind(schema) == "string":
        return None if nullable(schema) and text in _NULLS else text
    return json_value(text)


def json_value(text: str) -> Any:
    """A value written as JSON (or a Python literal); where it is neither, the text itself."""
    stripped = text.strip()
    try:
        return DECODER.decode(stripped)
    except ValueError:
        pass
    if stripped in _PYTHON_NAMES:
        return _PYTHON_NAMES[stripped]
    try:
        value = ast.literal_eval(stripped)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return value if _is_json(value) else text


def _is_json(value: Any) -> bool:
    """Whether a Python literal is a JSON value (a tuple, set, bytes or complex is not)."""
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    if isinstance(value, list):
        return all(map(_is_json, value))
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False
