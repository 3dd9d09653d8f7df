"""Regexes as JSON Schema (ECMA-262) reads them: `\\d`, `\\w`, `\\s` and their negations.

llguidance parses regexes with the Rust regex crate, whose shorthand classes are Unicode's: `\\d`
matches any decimal digit (Arabic-Indic `٣`, fullwidth `５`, …), `\\w` any letter, `\\s` Unicode
White_Space (NEL, U+0085, included; the BOM, U+FEFF, not). Its JSON schema compiler already
narrows `\\d` and `\\w` in `pattern` to ASCII, but not `\\s`, and its regex grammars narrow
nothing. A user of JSON Schema, or of the peers' regex grammars, expects ECMA-262's sets, so
`to_ecma` writes each shorthand out as the explicit set ECMA-262 gives it, before llguidance
sees the regex; every other character is left as it was.

Two more changes, both to what the Rust crate would refuse: ECMA-262 reads `-` next to a
shorthand inside a class (`[\\d-z]`, `[a-\\d]`) as a literal hyphen, so such a hyphen is
escaped; and `[\\b]` (a backspace in ECMA-262) becomes `[\\x08]`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

_MAX = 0x10FFFF

# ECMA-262's CharacterClassEscape sets; `\s` is its WhiteSpace and LineTerminator together.
ECMA_DIGIT = frozenset(range(ord("0"), ord("9") + 1))
ECMA_WORD = frozenset(
    [*ECMA_DIGIT, *range(ord("A"), ord("Z") + 1), *range(ord("a"), ord("z") + 1), ord("_")]
)
ECMA_SPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0xA0, 0x1680, *range(0x2000, 0x200B)]
    + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF]
)


def _escape(cp: int) -> str:
    """A code point as the Rust crate and Python's `re` both read it inside a class."""
    if chr(cp).isascii() and (chr(cp).isalnum() or cp == ord("_")):
        return chr(cp)  # `0-9`, not `\x30-\x39`: the pattern stays readable in errors
    if cp <= 0xFF:
        return f"\\x{cp:02x}"
    if cp <= 0xFFFF:
        return f"\\u{cp:04x}"
    return f"\\U{cp:08x}"


def _ranges(points: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for cp in sorted(points):
        if out and out[-1][1] == cp - 1:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return out


def _items(ranges: list[tuple[int, int]]) -> str:
    """Class items (without brackets) for the ranges, every bound escaped."""
    return "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in ranges)


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, low = [], 0
    for a, b in ranges:
        if a > low:
            out.append((low, a - 1))
        low = b + 1
    if low <= _MAX:
        out.append((low, _MAX))
    return out


def _shorthands() -> dict[str, str]:
    sets = {"d": ECMA_DIGIT, "w": ECMA_WORD, "s": ECMA_SPACE}
    out = {}
    for letter, points in sets.items():
        ranges = _ranges(points)
        # Negations written out too, not as `[^…]`: they must also fit inside a class, where
        # the Rust crate would take `[^…]` for a nested class but Python's `re` (the tests'
        # reference) would not.
        out[letter], out[letter.upper()] = _items(ranges), _items(_complement(ranges))
    return out


# Class items (no brackets) for each shorthand letter.
SHORTHANDS: dict[str, str] = _shorthands()


def to_ecma(regex: str) -> str:
    """`regex` (the Rust crate's syntax, as llguidance reads it) with `\\d \\D \\w \\W \\s \\S`
    as ECMA-262 defines them; everything else unchanged."""
    out: list[str] = []
    depth = 0  # inside how many classes: the Rust crate nests them (`[a[^b]]`)
    after_shorthand = False  # the last class item was a shorthand (for `[\d-z]`)
    i, n = 0, len(regex)
    while i < n:
        c = regex[i]
        was_shorthand, after_shorthand = after_shorthand, False
        if c == "\\" and i + 1 < n:
            letter = regex[i + 1]
            i += 2
            if letter in SHORTHANDS:
                out.append(SHORTHANDS[letter] if depth else f"[{SHORTHANDS[letter]}]")
                after_shorthand = depth > 0
            elif letter == "b" and depth:
                out.append("\\x08")
            else:
                out.append(c + letter)  # any other escape (`\\`, `\[`, `\p`, …) as it was
            continue
        i += 1
        if c == "[":
            depth += 1
            out.append(c)
            # `^` and then a `]` right after the opening are literal, not the end.
            if i < n and regex[i] == "^":
                out.append("^")
                i += 1
            if i < n and regex[i] == "]":
                out.append("]")
                i += 1
        elif c == "]" and depth:
            depth -= 1
            out.append(c)
        elif c == "-" and depth and (was_shorthand or _shorthand_at(regex, i)):
            out.append("\\-")
        else:
            out.append(c)
    return "".join(out)


def _shorthand_at(regex: str, i: int) -> bool:
    return regex.startswith("\\", i) and i + 1 < len(regex) and regex[i + 1] in SHORTHANDS


# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_SCHEMA = (
    "items additionalItems additionalProperties unevaluatedItems unevaluatedProperties contains "
    "propertyNames not if then else"
).split()
_SCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAP = ("properties", "$defs", "definitions", "dependentSchemas", "dependencies")


def ecma_schema(schema: Any) -> Any:
    """A copy of a JSON schema (parsed) with every `pattern` and `patternProperties` key in
    ECMA-262's reading; values that are not schemas (`enum`, `const`, `default`, …) untouched."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("pattern"), str):
        out["pattern"] = to_ecma(out["pattern"])
    for key in _SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = ecma_schema(out[key])
    for key in _SCHEMA_LIST:
        if isinstance(out.get(key), list):
            out[key] = [ecma_schema(s) for s in out[key]]
    for key in _SCHEMA_MAP:  # names, not regexes: only the schemas change
        if isinstance(out.get(key), dict):
            out[key] = {name: ecma_schema(s) for name, s in out[key].items()}
    if isinstance(out.get("patternProperties"), dict):
        out["patternProperties"] = {
            to_ecma(key): ecma_schema(s) for key, s in out["patternProperties"].items()
        }
    return out


def ecma_schema_text(text: str) -> str:
    """`ecma_schema` of a schema given as JSON text; the text itself where nothing changes
    (or where it is not JSON: llguidance says what is wrong with it)."""
    try:
        schema = json.loads(text)
    except ValueError:
        return text
    ecma = ecma_schema(schema)
    return text if ecma == schema else json.dumps(ecma, ensure_ascii=False)
