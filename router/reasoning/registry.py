"""`--reasoning-parser` names (vLLM's) and the parsers they select."""

from __future__ import annotations

from router.reasoning.append_think import MiniMaxM2AppendThinkParser
from router.reasoning.harmony import HarmonyParser
from router.reasoning.parsers import (
    DeepSeekR1Parser,
    DeepSeekV3Parser,
    Ernie45Parser,
    Glm45Parser,
    KimiK2Parser,
    MiniMaxM2Parser,
    MistralParser,
    Qwen3Parser,
    SeedOssParser,
    Step3Parser,
)
from router.reasoning.text_markers import GraniteParser, HunyuanA13BParser, Olmo3Parser
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
        DeepSeekV3Parser,
        Ernie45Parser,
        GraniteParser,
        HunyuanA13BParser,
        KimiK2Parser,
        MiniMaxM2AppendThinkParser,
        MistralParser,
        Olmo3Parser,
        Step3Parser,
    )
}


def reasoning_parser(name: str) -> ReasoningParser:
    """The parser `name` selects; ValueError naming the choices for any other name."""
    try:
        return REASONING_PARSERS[name]()
    except KeyError:
        choices = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning parser {name!r} (choices: {choices})") from None
