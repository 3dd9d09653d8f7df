"""What the operator turned on for /v1/chat/completions answers: the tool-call parser
(`--tool-call-parser`, `--enable-auto-tool-choice`) and the reasoning parser
(`--reasoning-parser`), checked against the model's tokenizer at startup."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from router.limits import ConfigError
from router.reasoning.types import ReasoningParser
from router.tool_calls.types import MarkerTerm, ToolParser


@dataclass(frozen=True)
class ReasoningTokens:
    """The think block's markers as token ids: the grammar of a request waits for `end`
    (router/reasoning/gate.py), so each must be one token of the vocabulary. A parser that is
    not `gated` (harmony) has none: its grammar holds from the first token."""

    start: int
    end: int


@dataclass(frozen=True)
class ChatFeatures:
    tool_parser: ToolParser | None = None
    auto_tool_choice: bool = False  # vLLM's --enable-auto-tool-choice
    reasoning: ReasoningParser | None = None
    reasoning_tokens: ReasoningTokens | None = None
    marker: MarkerTerm = json.dumps  # how grammars name a marker (its token where it is one)
    markers: frozenset[str] = field(init=False)  # what the parsers must see (set below)

    def __post_init__(self) -> None:
        """Special tokens whose text the parsers must see in the answer: derived once, read
        by every chat request."""
        found = set(self.tool_parser.markers if self.tool_parser else ())
        if self.reasoning is not None:
            found.update(self.reasoning.markers)
        object.__setattr__(self, "markers", frozenset(found))


def single_token(tokenizer, text: str) -> int | None:
    """The id of `text` when the vocabulary holds it as one token (added tokens included)."""
    token_id = tokenizer.convert_tokens_to_ids(text)
    if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
        if tokenizer.convert_ids_to_tokens(token_id) == text:
            return token_id
    return None


def marker_term(tokenizer) -> MarkerTerm:
    """A marker in llguidance's Lark: its token by id where it is one token (the only way to
    name a special token there), else its text."""

    def term(text: str) -> str:
        token_id = single_token(tokenizer, text)
        return f"<[{token_id}]>" if token_id is not None else json.dumps(text)

    return term


def chat_features(
    tokenizer, tool_parser_name: str | None, auto_tool_choice: bool, reasoning_name: str | None
) -> ChatFeatures:
    """Raises ConfigError naming the flag when the combination cannot work on this model."""
    if auto_tool_choice and tool_parser_name is None:
        raise ConfigError("--enable-auto-tool-choice needs --tool-call-parser to say the format")
    parser = reasoning = None
    if tool_parser_name:
        from router.tool_calls.registry import tool_parser

        parser = tool_parser(tool_parser_name)
    if reasoning_name:
        from router.reasoning.registry import reasoning_parser

        reasoning = reasoning_parser(reasoning_name)
    tokens = None
    if reasoning is not None:
        ids = {marker: single_token(tokenizer, marker) for marker in reasoning.markers}
        missing = [marker for marker, token_id in ids.items() if token_id is None]
        if missing:
            raise ConfigError(
                f"--reasoning-parser {reasoning.name}: the model's tokenizer has no single token "
                f"for {' and '.join(map(repr, missing))}; it is not a {reasoning.name} model"
            )
        if reasoning.gated:
            tokens = ReasoningTokens(ids[reasoning.start], ids[reasoning.end])
    return ChatFeatures(parser, auto_tool_choice, reasoning, tokens, marker_term(tokenizer))
