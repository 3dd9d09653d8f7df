"""A grammar that starts once the model stops reasoning: `response_format` or an enforced
`tool_choice` constrains the answer, never the think block before it (vLLM's behaviour).

The gate watches the sampled token ids for the reasoning parser's end marker (one token, checked
at startup); until it comes, every token is allowed. Where the answer may or may not open with a
think block (Qwen3: it thinks only when its first token is the start marker), the first step
allows the start marker beside what the grammar allows. Parsers that are not `gated` (harmony,
whose reasoning is a channel, not a block; think blocks spelled in plain text, with no token to
watch for) get no gate: their grammar holds from the first token.
"""

from __future__ import annotations

from router.reasoning.types import ReasoningParser
from router.structured import CompiledGrammar, TokenConstraint


def opened_in(prompt: str, start: str, end: str) -> bool:
    """Whether the prompt ends inside a think block (DeepSeek-R1's template opens one)."""
    return prompt.rfind(start) > prompt.rfind(end)


def first_state(prompt: str, parser: ReasoningParser) -> str:
    """Where a request's answer starts: "reasoning" (the prompt opened the block, or the model
    always reasons first), "answer" (the template closed an empty block just before the answer,
    as Qwen3's does with enable_thinking false: no more thinking), or "first" (the model thinks
    only if its first token opens the block; a parser that is not gated, always: harmony's
    answers each open their own messages, and a plain-text block is read from the answer)."""
    if not parser.gated:
        return "first"
    if opened_in(prompt, parser.start, parser.end):
        return "reasoning"
    if prompt.rstrip().endswith(parser.end):
        return "answer"
    return "first" if parser.optional else "reasoning"


class AfterReasoning:
    """A CompiledGrammar stand-in: every request started from it waits for the end of reasoning."""

    def __init__(self, grammar: CompiledGrammar, start_id: int, end_id: int, state: str) -> None:
        """`state`: where the answer starts (`first_state`)."""
        self._grammar = grammar
        self._start_id, self._end_id = start_id, end_id
        self._state = state

    def start(self) -> ReasoningGate:
        return ReasoningGate(self._grammar.start(), self._start_id, self._end_id, self._state)


class ReasoningGate:
    """TokenConstraint's interface (mask, accept, ended) over one request's grammar."""

    def __init__(self, inner: TokenConstraint, start_id: int, end_id: int, state: str) -> None:
        self._inner = inner
        self._start_id, self._end_id = start_id, end_id
        self._state = state  # "first" (may open a think block), "reasoning", "answer"
        self._any: bytes | None = None  # the all-allowing mask of the reasoning steps

    @property
    def ended(self) -> bool:
        return self._state == "answer" and self._inner.ended

    def mask(self) -> bytes:
        if self._state == "reasoning":
            if self._any is None:  # built once: every reasoning step of the request sends it
                self._any = b"\xff" * len(self._inner.mask())
            return self._any
        mask = self._inner.mask()
        if self._state == "first":
            mask = bytearray(mask)
            mask[self._start_id // 8] |= 1 << (self._start_id % 8)
            mask = bytes(mask)
        return mask

    def accept(self, token_id: int) -> None:
        if self._state == "reasoning":
            if token_id == self._end_id:
                self._state = "answer"
            return
        if self._state == "first":
            if token_id == self._start_id:
                self._state = "reasoning"
                return
            self._state = "answer"
        self._inner.accept(token_id)
