"""Think blocks whose markers are plain text, spelled out in ordinary tokens: Granite 3.x,
Hunyuan-A13B, Olmo 3.

They parse as the other think blocks do (router/reasoning/parsers.py), but there is nothing to
check in the tokenizer (`markers` is empty: the answer's text holds them already) and no token to
wait for, so they are not `gated`: a grammar (`response_format`, an enforced `tool_choice`)
constrains such an answer from its first token, and the model writes no reasoning then.
"""

from __future__ import annotations

from typing import ClassVar

from router.reasoning.content import AnswerTags
from router.reasoning.parsers import ThinkParser
from router.reasoning.types import ReasoningStream


class TextThinkParser(ThinkParser):
    markers: ClassVar[tuple[str, ...]] = ()
    gated: ClassVar[bool] = False


class GraniteParser(TextThinkParser):
    """Granite 3.2/3.3 with `chat_template_kwargs: {"thinking": true}` (its system prompt asks
    for both phrases): "Here is my thought process: … Here is my response: …", where quantized
    models write "Here's" at times. Without the first phrase the answer is content."""

    name = "granite"
    start = "Here is my thought process:"
    end = "Here is my response:"
    start_forms = ("Here's my thought process:",)
    end_forms = ("Here's my response:",)
    optional = True


class HunyuanA13BParser(TextThinkParser):
    """Hunyuan-A13B: `<think>\\n…\\n</think>\\n<answer>\\n…\\n</answer>`, the block empty (or
    left out) when it does not think; the answer tags go too."""

    name = "hunyuan_a13b"
    optional = True

    def content_stage(self) -> ReasoningStream:
        return AnswerTags("<answer>", "</answer>")


class Olmo3Parser(TextThinkParser):
    """Olmo 3 Think: its template ends the prompt with `<think>`; the answer reasons up to
    `</think>` (an answer that opens the block itself is read the same)."""

    name = "olmo3"
    optional = False
