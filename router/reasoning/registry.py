"""`--reasoning-parser` names (vLLM's) and the parsers they select."""

from __future__ import annotations

from router.reasoning.parsers import DeepSeekR1Parser, Qwen3Parser, ThinkParser

REASONING_PARSERS: dict[str, type[ThinkParser]] = {
    parser.name: parser for parser in (DeepSeekR1Parser, Qwen3Parser)
}


def reasoning_parser(name: str) -> ThinkParser:
    """The parser `name` selects; ValueError naming the choices for any other name."""
    try:
        return REASONING_PARSERS[name]()
    except KeyError:
        choices = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning parser {name!r} (choices: {choices})") from None
