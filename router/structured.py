"""Structured output: a JSON schema or a regular expression every generated text must match.

The router holds each constrained request's grammar state (llguidance's matcher, built over the
model's tokenizer) and sends the shards, with every step, the tokens its next sample may be
(`token_masks` in the Prefill/Decode requests, one bit per token id); the shards only mask
their logits with it (shard/sampling/token_masks.py). The router advances the state with each
token it gets back. Once the grammar is complete the mask allows only the EOS token, so the
request ends as the model ends it, with its EOS token (as TGI and transformers with a grammar
processor do).

Grammars are compiled when the request is validated, off the event loop: an invalid schema or
regex is a 422 naming the field before anything is queued.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import llguidance
import llguidance.hf

from router.errors import GenerationError, ValidationError
from router.regex_dialect import ecma_schema_text, to_ecma

log = logging.getLogger(__name__)

GrammarKind = Literal["json", "regex", "lark"]

# Between JSON tokens at most one space, as TGI (outlines' default) allows: with any amount
# allowed, a weak model can spend its whole budget on whitespace and never close the object.
# A schema's own "x-guidance" options (llguidance's) override it.
JSON_DEFAULTS: dict[str, Any] = {"whitespace_pattern": "[ ]?"}


@dataclass(frozen=True)
class GrammarSpec:
    """What the caller asked for, as every API hands it over."""

    kind: GrammarKind
    value: str  # the JSON schema as text, the regex, or a Lark grammar (llguidance's dialect)
    field: str = "grammar"  # how the caller named it, for errors


class Grammars:
    """Compiles grammars over the model's tokenizer (built once: about a second for a large
    vocabulary). `unavailable` says why structured output cannot be served, if it cannot."""

    def __init__(self, tokenizer, eos_token_ids: Iterable[int]) -> None:
        self.unavailable: str | None = None
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._eos = frozenset(eos_token_ids)
        try:
            eos = sorted(self._eos) or None  # None: the tokenizer's own
            self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, eos_token=eos)
        except Exception as err:  # e.g. a slow (Python) tokenizer: llguidance needs a fast one
            self.unavailable = f"the model's tokenizer cannot be used for grammars ({err})"
            log.warning("structured output is unavailable: %s", self.unavailable)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Blocks for as long as the grammar takes to build (run it off the event loop)."""
        if self._tokenizer is None:
            raise ValidationError(f"`{spec.field}` is not supported: {self.unavailable}")
        try:
            # Regexes and schema patterns read as JSON Schema's (ECMA-262) `\d \w \s`, not as
            # the Rust crate's Unicode ones (router/regex_dialect.py).
            if spec.kind == "json":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    ecma_schema_text(spec.value), defaults=JSON_DEFAULTS
                )
            elif spec.kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(to_ecma(spec.value))
            else:
                grammar = llguidance.LLMatcher.grammar_from_lark(spec.value)
            matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        except ValueError as err:  # llguidance's refusal, its own limits included
            raise ValidationError(f"`{spec.field}` is not valid: {err}") from None
        except Exception as err:
            # Still about this grammar, which the client wrote: its error, not the server's.
            log.warning("llguidance failed on a grammar (%s)", spec.field, exc_info=True)
            raise ValidationError(
                f"`{spec.field}` cannot be compiled by llguidance ({type(err).__name__})"
            ) from None
        # Some grammars fail only when asked for a first token (a regex no text matches): that
        # is the caller's error too, found now rather than as a failed generation. The mask is
        # every request's first one, kept for its first step.
        first = b"" if matcher.is_error() else matcher.compute_bitmask()
        if matcher.is_error():
            raise ValidationError(f"`{spec.field}` is not valid: {_first_line(matcher)}")
        if not any(first):
            raise ValidationError(f"`{spec.field}` allows no output")
        return CompiledGrammar(matcher, self._eos, first)


def choice_grammar(choices: Iterable[str]) -> str:
    """vLLM's `choice`: exactly one of the strings (a JSON string is a Lark literal)."""
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class CompiledGrammar:
    """A grammar in its initial state; each request (each best_of candidate) starts its own."""

    def __init__(
        self, matcher: llguidance.LLMatcher, eos_token_ids: frozenset[int], first_mask: bytes
    ) -> None:
        self._initial = matcher
        self._eos = eos_token_ids
        self._first_mask = first_mask

    def start(self) -> TokenConstraint:
        return TokenConstraint(self._initial.deep_copy(), self._eos, self._first_mask)


class TokenConstraint:
    """One request's place in its grammar."""

    def __init__(
        self, matcher: llguidance.LLMatcher, eos_token_ids: frozenset[int], first_mask: bytes
    ) -> None:
        self._matcher = matcher
        self._eos = eos_token_ids
        # The mask of the current state: a chunked prompt asks for it at every step until its
        # first token, and it changes only when a token is accepted.
        self._mask: bytes | None = first_mask
        # The grammar was complete and took its EOS token: nothing may follow, also for a
        # request that ignores EOS (whose stopping criteria would go on).
        self.ended = False

    def mask(self) -> bytes:
        """The tokens the next sample may be, in the wire's layout (llguidance's own)."""
        if self._mask is None:
            mask = self._matcher.compute_bitmask()
            if self._matcher.is_error():
                raise GenerationError(f"the output grammar failed: {_first_line(self._matcher)}")
            self._mask = mask
        return self._mask

    def check_proposal(self, ids: Sequence[int]) -> tuple[list[int], list[bytes]]:
        """Speculative decoding (router/speculation/): the longest head of the proposed tokens
        that the grammar allows from here, and after each of them the mask of what may follow
        (the shards sample there too). The matcher is walked forward and rolled back: its
        state, and the mask kept for the next sample, are unchanged afterwards.

        EOS is never proposed: llguidance does not count a consumed EOS as a token, so it
        could not be rolled back, and proposing it saves nothing (the step samples EOS at that
        position by itself when the model ends there). A token after which nothing at all may
        follow ends the proposal before it (the shards refuse an empty mask)."""
        if self.ended:
            return [], []
        head: list[int] = []
        for token in ids:
            if token in self._eos:
                break
            head.append(token)
        allowed = self._matcher.validate_tokens(head) if head else 0
        masks: list[bytes] = []
        consumed = 0
        try:
            for token in head[:allowed]:
                if not self._matcher.consume_token(token):
                    break
                consumed += 1
                mask = self._matcher.compute_bitmask()
                if self._matcher.is_error() or not any(mask):
                    break
                masks.append(mask)
        finally:
            restored = self._matcher.rollback(consumed) if consumed else True
        if not restored or self._matcher.is_error():
            raise GenerationError(
                f"the output grammar failed while checking proposed tokens: "
                f"{_first_line(self._matcher)}"
            )
        return head[: len(masks)], masks

    def accept(self, token_id: int) -> None:
        self._mask = None
        if not self._matcher.consume_token(token_id):
            raise GenerationError(
                f"the output grammar refused token {token_id}: {_first_line(self._matcher)}"
            )
        self.ended = token_id in self._eos and self._matcher.is_stopped()


def _first_line(matcher: llguidance.LLMatcher) -> str:
    return (matcher.get_error() or "unknown error").strip().splitlines()[0]
