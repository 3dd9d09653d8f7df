"""Regexes and schema patterns read with ECMA-262's `\\d \\w \\s` (router/regex_dialect.py): the
translator against an independent reference, then llguidance's masks over a vocabulary with
Unicode digits and spaces, checked with Python's `re` (ASCII) and `jsonschema`."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.tiny_models import build_tokenizer
from router.regex_dialect import ecma_schema, ecma_schema_text, to_ecma
from router.structured import Grammars, GrammarSpec, TokenConstraint

# ECMA-262's sets, written out here apart from the module's.
SPACE = set("\t\n\v\f\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff") | {
    chr(c) for c in range(0x2000, 0x200B)
}
MEMBER = {
    "d": lambda ch: "0" <= ch <= "9",
    "w": lambda ch: ch.isascii() and (ch.isalnum() or ch == "_"),
    "s": lambda ch: ch in SPACE,
}
for _letter, _test in list(MEMBER.items()):
    MEMBER[_letter.upper()] = lambda ch, test=_test: not test(ch)

EVERY_CHAR = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)


@pytest.mark.parametrize(
    ("regex", "ecma"),
    [
        (r"[A-Z]{2}-\d{3}-(red|blue)", r"[A-Z]{2}-[0-9]{3}-(red|blue)"),
        (r"\w+", r"[0-9A-Z_a-z]+"),
        (r"[\d.]", r"[0-9.]"),
        (r"[^\d]", r"[^0-9]"),
        (r"[\D]", r"[\x00-\x2f\x3a-\U0010ffff]"),
        (r"\\d\\\d", r"\\d\\[0-9]"),  # an escaped backslash, then a shorthand
        (r"[]\d]", r"[]0-9]"),  # `]` first in a class is a literal
        (r"[^]\w]", r"[^]0-9A-Z_a-z]"),
        (r"[\d-z]", r"[0-9\-z]"),  # ECMA-262: a literal hyphen beside a shorthand
        (r"[a-\d]", r"[a\-0-9]"),
        (r"[a-z-]", r"[a-z-]"),  # hyphens elsewhere as they were
        (r"[\b]", r"[\x08]"),  # backspace in a class
        (r"\bx\b", r"\bx\b"),  # a word boundary left to llguidance (which refuses it)
        (r"\p{L}\x41\u{42}\[\d\]", r"\p{L}\x41\u{42}\[[0-9]\]"),
        (r"[a[^\d]]", r"[a[^0-9]]"),  # the Rust crate's nested classes
        ("\\", "\\"),
        ("", ""),
    ],
)
def test_examples(regex: str, ecma: str) -> None:
    assert to_ecma(regex) == ecma


@pytest.mark.parametrize("letter", "dws")
def test_every_code_point(letter: str) -> None:
    """Each shorthand and its negation, alone, in a class and in a negated class, over all of
    Unicode."""
    members = "".join(ch for ch in map(chr, range(0x10000)) if MEMBER[letter](ch))  # all BMP
    others = EVERY_CHAR.translate(dict.fromkeys(map(ord, members)))
    for regex, want in [
        (f"\\{letter}", members),
        (f"[\\{letter}]", members),
        (f"[^\\{letter}]", others),
        (f"\\{letter.upper()}", others),
        (f"[\\{letter.upper()}]", others),
        (f"[^\\{letter.upper()}]", members),
    ]:
        assert "".join(re.findall(to_ecma(regex), EVERY_CHAR)) == want, regex


# Random regexes over a small alphabet, matched against a reference built independently: each
# class is written as the list of the alphabet's characters in it (by the sets above).
ALPHABET = "09a_Z-. \t\u00a0\u0085\ufeff\x1c\u0663\uff15\u00e9\\d"
SHORT = [f"\\{c}" for c in "dDwWsS"]


@st.composite
def class_item(draw: st.DrawFn) -> tuple[str, set[str]]:
    """(regex text, the alphabet's characters it stands for)."""
    kind = draw(st.sampled_from(["char", "short", "range"]))
    if kind == "short":
        text = draw(st.sampled_from(SHORT))
        return text, {ch for ch in ALPHABET if MEMBER[text[1]](ch)}
    if kind == "range":
        a, b = sorted(draw(st.lists(st.sampled_from("09aZ"), min_size=2, max_size=2)))
        return f"{a}-{b}", {ch for ch in ALPHABET if a <= ch <= b}
    ch = draw(st.sampled_from(ALPHABET))
    return re.escape(ch) if ch in "\\-^]" else ch, {ch}


def _set(chars: set[str]) -> str:
    return "(?:" + "|".join(map(re.escape, sorted(chars))) + ")" if chars else "(?!)"


@st.composite
def atom(draw: st.DrawFn) -> tuple[str, str]:
    """(regex text, reference regex)."""
    kind = draw(st.sampled_from(["char", "short", "class", "group"]))
    if kind == "char":
        ch = draw(st.sampled_from(ALPHABET))
        return re.escape(ch), re.escape(ch)
    if kind == "short":
        text = draw(st.sampled_from(SHORT))
        return text, _set({ch for ch in ALPHABET if MEMBER[text[1]](ch)})
    if kind == "class":
        items = draw(st.lists(class_item(), min_size=1, max_size=4))
        negated = draw(st.booleans())
        chars = set().union(*(chars for _, chars in items))
        if negated:
            chars = set(ALPHABET) - chars
        return "[" + "^" * negated + "".join(t for t, _ in items) + "]", _set(chars)
    branches = draw(st.lists(sequence(), min_size=1, max_size=2))
    return (
        "(" + "|".join(t for t, _ in branches) + ")",
        "(" + "|".join(r for _, r in branches) + ")",
    )


@st.composite
def sequence(draw: st.DrawFn) -> tuple[str, str]:
    parts = draw(st.lists(st.tuples(atom(), st.sampled_from(["", "?", "*", "+"])), max_size=3))
    return "".join(t + q for (t, _), q in parts), "".join(f"(?:{r}){q}" for (_, r), q in parts)


# Derandomized: nested quantifiers such as ((a*)*)* make Python's backtracking `re` (both sides
# of the comparison) exponential on a text it cannot match, and a random run once drew one that
# held a CI worker for over ten minutes; the fixed examples finish in seconds.
@settings(max_examples=150, deadline=None, derandomize=True)
@given(pair=sequence(), texts=st.lists(st.text(ALPHABET, max_size=5), min_size=1, max_size=10))
def test_random_regexes(pair: tuple[str, str], texts: list[str]) -> None:
    regex, reference = pair
    translated = re.compile(to_ecma(regex))
    for text in texts:
        assert bool(translated.fullmatch(text)) == bool(re.fullmatch(reference, text)), text


def test_schema_walk() -> None:
    schema = {
        "type": "object",
        "properties": {
            # A property named `pattern`: a name, not a regex.
            "pattern": {"type": "string", "pattern": r"\d"},
            "list": {
                "type": "array",
                "items": {"pattern": r"\w"},
                "prefixItems": [{"pattern": r"\s"}],
            },
        },
        "patternProperties": {r"^\d+$": {"anyOf": [{"pattern": r"\D"}, {"$ref": "#/$defs/x"}]}},
        "$defs": {"x": {"not": {"pattern": r"\S"}}},
        "enum": [{"pattern": r"\d"}],  # values, not schemas
    }
    ecma = ecma_schema(schema)
    props = ecma["properties"]
    assert set(props) == {"pattern", "list"}
    assert props["pattern"]["pattern"] == "[0-9]"
    assert props["list"]["items"]["pattern"] == "[0-9A-Z_a-z]"
    assert props["list"]["prefixItems"][0]["pattern"] == to_ecma(r"\s")
    ((key, value),) = ecma["patternProperties"].items()
    assert key == "^[0-9]+$"
    assert value["anyOf"][0]["pattern"] == to_ecma(r"\D")
    assert ecma["$defs"]["x"]["not"]["pattern"] == to_ecma(r"\S")
    assert ecma["enum"] == [{"pattern": r"\d"}]
    assert schema["properties"]["pattern"]["pattern"] == r"\d"  # the original untouched
    text = json.dumps({"type": "string", "maxLength": 3})
    assert ecma_schema_text(text) is text
    assert ecma_schema_text("{not json") == "{not json"


# llguidance over a vocabulary where Unicode digits and spaces are tokens of their own.
DIGITS = [
    "\U0001ccf2",
    "\u0663",
    "\uff15",
    "\u0966",
]  # outlined, Arabic-Indic, fullwidth, Devanagari
SPACES = ["\u00a0", "\ufeff", "\u2028", "\u0085", "\u180e"]


@pytest.fixture(scope="module")
def vocab():
    tok = build_tokenizer(512)
    tok.add_tokens(DIGITS + SPACES + ["é"])
    return tok, Grammars(tok, [tok.eos_token_id])


def _allowed(constraint: TokenConstraint) -> list[int]:
    mask = constraint.mask()
    return [i for i in range(len(mask) * 8) if mask[i // 8] >> (i % 8) & 1]


def _feed(tok, constraint: TokenConstraint, text: str) -> None:
    for token_id in tok.encode(text, add_special_tokens=False):
        constraint.accept(token_id)


def _walk(tok, constraint: TokenConstraint, rng: random.Random, closers: str) -> str:
    """Random allowed tokens until EOS; past 40 steps it takes a token with one of `closers`,
    or EOS, where it may, so the walk ends."""
    ids: list[int] = []
    while True:
        allowed = _allowed(constraint)
        if len(ids) > 40:
            ending = [
                i
                for i in allowed
                if i == tok.eos_token_id or any(c in tok.decode([i]) for c in closers)
            ]
            allowed = ending or allowed
        token_id = rng.choice(allowed)
        constraint.accept(token_id)
        if token_id == tok.eos_token_id:
            assert constraint.ended
            return tok.decode(ids)
        ids.append(token_id)


def test_regex_digits(vocab) -> None:
    tok, grammars = vocab
    pattern = r"[A-Z]{2}-\d{3}-(red|blue)"
    grammar = grammars.compile(GrammarSpec("regex", pattern))
    constraint = grammar.start()
    _feed(tok, constraint, "TH-")
    allowed = {tok.convert_ids_to_tokens(i) for i in _allowed(constraint)}
    assert not allowed & set(DIGITS)
    assert {str(d) for d in range(10)} <= {tok.decode([i]) for i in _allowed(constraint)}
    rng = random.Random(0)
    for _ in range(30):
        out = _walk(tok, grammar.start(), rng, "")
        assert re.fullmatch(pattern, out, re.ASCII), out


def test_regex_spaces(vocab) -> None:
    tok, grammars = vocab
    constraint = grammars.compile(GrammarSpec("regex", r"a\sb")).start()
    _feed(tok, constraint, "a")
    allowed = {tok.convert_ids_to_tokens(i) for i in _allowed(constraint)}
    assert {"\u00a0", "\ufeff", "\u2028"} <= allowed  # ECMA-262's WhiteSpace, LineTerminator
    assert not {"\u0085", "\u180e"} & allowed  # Unicode White_Space (NEL), or neither


def test_schema_pattern(vocab) -> None:
    tok, grammars = vocab
    schema = {"type": "string", "pattern": "^\\d{3}-\\w+$"}
    grammar = grammars.compile(GrammarSpec("json", json.dumps(schema)))
    constraint = grammar.start()
    _feed(tok, constraint, '"12')
    assert not {tok.convert_ids_to_tokens(i) for i in _allowed(constraint)} & set(DIGITS)
    rng = random.Random(1)
    for _ in range(30):
        value = json.loads(_walk(tok, grammar.start(), rng, '"'))
        # jsonschema's `pattern` is Python's re.search, whose `\d` and `\w` are Unicode: it would
        # pass `٣`, so the ASCII reading is checked too.
        jsonschema.validate(value, schema)
        assert re.search(schema["pattern"], value, re.ASCII), value
        assert value.isascii(), value


def test_schema_pattern_properties(vocab) -> None:
    tok, grammars = vocab
    schema = {
        "type": "object",
        "patternProperties": {"^\\w$": {"type": "string", "pattern": "^\\s$"}},
        "additionalProperties": False,
        "minProperties": 1,
        "maxProperties": 1,
    }
    constraint = grammars.compile(GrammarSpec("json", json.dumps(schema))).start()
    _feed(tok, constraint, '{"')
    allowed = {tok.convert_ids_to_tokens(i) for i in _allowed(constraint)}
    assert not allowed & {"é", *DIGITS}
    _feed(tok, constraint, 'x":"')
    allowed = {tok.convert_ids_to_tokens(i) for i in _allowed(constraint)}
    assert {"\u00a0", "\ufeff", "\u2028"} <= allowed  # llguidance's own `\s` has no U+FEFF
    assert not {"\u0085", "\u180e"} & allowed
