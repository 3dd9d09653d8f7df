"""Proposals for structured output, with real grammars compiled by llguidance over the tests'
tokenizer: the proposal is cut at the first token the grammar refuses (and before EOS), each kept
token carries the mask the matcher gives after consuming the proposal up to it one token at a
time, and the request's own grammar state is left exactly as it was."""

from __future__ import annotations

import json

import pytest

from router.speculation.grammar import check_drafts
from router.structured import Grammars, GrammarSpec, TokenConstraint

EOS = 2


@pytest.fixture(scope="module")
def grammars(tokenizer) -> Grammars:
    return Grammars(tokenizer, [EOS])


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def one_at_a_time(constraint: TokenConstraint, tokens: list[int]) -> list[bytes]:
    """The reference: a copy of the matcher, each token consumed, the mask read after it."""
    matcher = constraint._matcher.deep_copy()
    masks = []
    for token in tokens:
        assert matcher.consume_token(token), matcher.get_error()
        masks.append(matcher.compute_bitmask())
    return masks


def allowed(mask: bytes) -> set[int]:
    bits = int.from_bytes(mask, "little")
    return {i for i in range(len(mask) * 8) if bits >> i & 1}


def test_regex_proposals_are_cut_where_the_grammar_refuses(grammars, tokenizer):
    constraint = grammars.compile(GrammarSpec("regex", r"(ab|cd)[0-9]{2,3}")).start()
    before = constraint.mask()
    text = ids(tokenizer, "ab1234x")  # the 4th digit and the x are refused
    kept, masks = constraint.check_proposal(text)
    assert kept == ids(tokenizer, "ab123")
    assert masks == one_at_a_time(constraint, kept)
    assert allowed(masks[-1]) == {EOS}  # complete: only EOS may follow
    assert allowed(masks[0]) == set(ids(tokenizer, "b"))
    # Nothing moved: the same next mask, and the tokens are still accepted one by one.
    assert constraint.mask() == before
    assert constraint._matcher.compute_bitmask() == before
    # Refused at once: nothing to propose; EOS ends a proposal before it.
    assert constraint.check_proposal(ids(tokenizer, "x")) == ([], [])
    assert constraint.check_proposal(ids(tokenizer, "a") + [EOS] + ids(tokenizer, "b")) == (
        ids(tokenizer, "a"),
        one_at_a_time(constraint, ids(tokenizer, "a")),
    )
    for token in ids(tokenizer, "cd12"):
        constraint.accept(token)
    # From a later state too; the grammar allows EOS here, which is never proposed.
    kept, masks = constraint.check_proposal([EOS] + ids(tokenizer, "3"))
    assert (kept, masks) == ([], [])
    kept, masks = constraint.check_proposal(ids(tokenizer, "34"))
    assert kept == ids(tokenizer, "3") and masks == one_at_a_time(constraint, kept)
    constraint.accept(ids(tokenizer, "3")[0])
    constraint.accept(EOS)
    assert constraint.ended and constraint.check_proposal(ids(tokenizer, "1")) == ([], [])


def test_json_schema_proposals_in_a_batch(grammars, tokenizer):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 4}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
    a = grammars.compile(GrammarSpec("json", json.dumps(schema))).start()
    b = grammars.compile(GrammarSpec("regex", "[a-z]+")).start()
    for token in ids(tokenizer, '{"name'):
        a.accept(token)
    good = ids(tokenizer, '": "abcd", "n": 12}')
    head = ids(tokenizer, '": "abcd')
    bad = head + ids(tokenizer, 'e"')  # a fifth character breaks maxLength
    a_mask, b_mask = a.mask(), b.mask()

    class Row:  # what check_drafts reads of an entry
        def __init__(self, rid, constraint):
            self.id, self.constraint, self.request_id = rid, constraint, f"r{rid}"

    checked, failures = check_drafts([(Row(1, a), good), (Row(2, b), ids(tokenizer, "xyz9q"))])
    assert failures == []
    assert checked[1] == (good, one_at_a_time(a, good))
    assert checked[2][0] == ids(tokenizer, "xyz")
    assert checked[2][1] == one_at_a_time(b, ids(tokenizer, "xyz"))
    kept, masks = a.check_proposal(bad)
    assert kept == head and masks == one_at_a_time(a, kept)
    assert (a.mask(), b.mask()) == (a_mask, b_mask)
    for token in good:  # the real tokens still go through the untouched matcher
        a.accept(token)
