"""AnswerShape: where a chat answer starts decides what is reasoning, and the streamed deltas
add up to the whole message."""

from __future__ import annotations

import json

import pytest

from router.handlers.chat_answer import AnswerShape
from router.reasoning.gate import first_state
from router.reasoning.parsers import DeepSeekR1Parser, DeepSeekV3Parser, KimiK2Parser, Qwen3Parser
from router.reasoning.text_markers import GraniteParser, Olmo3Parser
from router.tool_calls.hermes import HermesParser

R1, QWEN3, V3, KIMI = DeepSeekR1Parser(), Qwen3Parser(), DeepSeekV3Parser(), KimiK2Parser()
GRANITE, OLMO3 = GraniteParser(), Olmo3Parser()
CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'


@pytest.mark.parametrize(
    "parser,prompt,start",
    [
        (R1, "<｜Assistant｜><think>\n", "reasoning"),  # R1's template opens the block
        (R1, "<think>\n\n</think>\n\n", "answer"),  # a template that closed it: no reasoning
        (R1, "<|im_start|>assistant\n", "reasoning"),  # R1 may leave the opening tag out
        (QWEN3, "<|im_start|>assistant\n", "first"),  # thinks only if it opens a block
        (QWEN3, "<|im_start|>assistant\n<think>\n\n</think>\n\n", "answer"),  # enable_thinking off
        (QWEN3, "<think>old</think> user: hi <think>\n", "reasoning"),
        # DeepSeek-V3.1's `thinking` kwarg: on opens the block, off closes it; V3-0324 neither.
        (V3, "<｜Assistant｜></think>hi<｜User｜>q<｜Assistant｜><think>", "reasoning"),
        (V3, "<｜User｜>q<｜Assistant｜></think>", "answer"),
        (V3, "<｜User｜>q<｜Assistant｜>", "first"),
        (KIMI, "<|im_assistant|>assistant<|im_middle|>", "reasoning"),
        (KIMI, "<|im_assistant|>assistant<|im_middle|><think></think>", "answer"),  # thinking off
        # Plain-text markers gate nothing: the parser reads the answer from its first token
        # (Olmo 3 Think's answer starts in reasoning all the same: its parser is not optional).
        (GRANITE, "Here is my thought process: ... Here is my response: ...", "first"),
        (OLMO3, "<|im_start|>assistant\n<think>", "first"),
    ],
)
def test_where_the_answer_starts(parser, prompt, start):
    assert first_state(prompt, parser) == start


@pytest.mark.parametrize(
    "parser,start,text,reasoning,content",
    [
        (R1, "reasoning", "plan</think>\n\nDone." + CALL, "plan", "Done."),
        (R1, "answer", "Done, no thinking." + CALL, None, "Done, no thinking."),
        (QWEN3, "first", "<think>\nplan\n</think>\n\n" + CALL, "plan", None),
        (QWEN3, "first", "Straight answer.", None, "Straight answer."),
        (KIMI, "reasoning", "plan</think>\n(no content)\n" + CALL, "plan", None),
        (KIMI, "reasoning", "plan</think>Done.(no content)" + CALL, "plan", "Done."),
        (
            GRANITE,
            "first",
            "Here's my thought process: plan Here's my response: Done." + CALL,
            "plan",
            "Done.",
        ),
        (OLMO3, "first", "plan</think>\n\nDone." + CALL, "plan", "Done."),
    ],
)
def test_whole_and_streamed_agree(parser, start, text, reasoning, content):
    shape = AnswerShape(parser, start, HermesParser(), frozenset())
    message = shape.message(text)
    assert (message["reasoning_content"], message["content"]) == (reasoning, content)
    assert [json.loads(c["function"]["arguments"]) for c in message.get("tool_calls", [])] == (
        [{"x": 1}] if CALL in text else []
    )
    stream = shape.stream()
    deltas = [d for ch in text for d in stream.push(ch)] + stream.finish()
    streamed_reasoning = "".join(d.get("reasoning_content", "") for d in deltas) or None
    streamed_content = "".join(d.get("content", "") for d in deltas) or None
    assert (streamed_reasoning, streamed_content) == (reasoning, content)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert stream.called == (CALL in text)
    if calls:
        assert calls[0]["function"]["name"] == "f" and calls[0]["id"].startswith("call_")
        assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"x": 1}
