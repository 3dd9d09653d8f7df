"""The tool-call parsers by the names `--tool-call-parser` takes (vLLM's)."""

from __future__ import annotations

from router.tool_calls.deepseek import DeepSeekV3Parser, DeepSeekV31Parser
from router.tool_calls.deepseek_v32 import DeepSeekV32Parser
from router.tool_calls.glm45 import Glm45Parser, Glm47Parser
from router.tool_calls.granite import GraniteParser
from router.tool_calls.hermes import Ernie45Parser, HermesParser
from router.tool_calls.hunyuan_a13b import HunyuanA13BParser
from router.tool_calls.kimi_k2 import KimiK2Parser
from router.tool_calls.llama3_json import Llama3JsonParser, Llama4JsonParser
from router.tool_calls.minimax_m2 import MiniMaxM2Parser
from router.tool_calls.mistral import MistralParser
from router.tool_calls.olmo3 import Olmo3Parser
from router.tool_calls.openai import OpenAIParser
from router.tool_calls.phi4_mini import Phi4MiniJsonParser
from router.tool_calls.pythonic import Llama4PythonicParser, PythonicParser
from router.tool_calls.qwen3_coder import Qwen3CoderParser, Qwen3XmlParser
from router.tool_calls.seed_oss import SeedOssParser
from router.tool_calls.types import ToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser
    for parser in (
        HermesParser,
        Llama3JsonParser,
        MistralParser,
        PythonicParser,
        OpenAIParser,
        Qwen3CoderParser,
        Qwen3XmlParser,
        Ernie45Parser,
        Glm45Parser,
        Glm47Parser,
        MiniMaxM2Parser,
        SeedOssParser,
        DeepSeekV3Parser,
        DeepSeekV31Parser,
        DeepSeekV32Parser,
        KimiK2Parser,
        Llama4PythonicParser,
        Llama4JsonParser,
        GraniteParser,
        Phi4MiniJsonParser,
        HunyuanA13BParser,
        Olmo3Parser,
    )
}


def tool_parser(name: str) -> ToolParser:
    """A parser by name; ValueError naming the choices for an unknown one."""
    try:
        parser = TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool-call parser {name!r}; choose one of: {', '.join(sorted(TOOL_PARSERS))}"
        ) from None
    return parser()
