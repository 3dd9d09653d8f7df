"""`--reasoning-parser` names (vLLM's) and the parsers they select."""

from __future__ import annotations

from router.reasoning.harmony import HarmonyParser
from router.reasoning.parsers import (
    DeepSeekR1Parser,
    Glm45Parser,
    MiniMaxM2Parser,
    Qwen3Parser,
    SeedOssParser,
)
from router.reasoning.types import ReasoningParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    parser.name: parser
    for parser in (
        DeepSeekR1Parser,
        Qwen3Parser,
        HarmonyParser,
        Glm45Parser,
        MiniMaxM2Parser,
        SeedOssParser,
    )
}


def reasoning_parser(name: str) -> ReasoningParser:
    """The parser `name` selects; ValueError naming the choices for any other name."""
    try:
        return REASONING_PARSERS[name]()
    except KeyError:
        choices = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning parser {name!r} (choices: {choices})") from None
