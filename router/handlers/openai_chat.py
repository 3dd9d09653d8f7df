"""POST /v1/chat/completions: OpenAI's chat API over the tokenizer's own chat template."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jinja2
from aiohttp import web

from router.api.chat import ChatRequest
from router.api.parsing import parse
from router.entry import Entry, Finished, Token, TokenEvent
from router.errors import RouterError, ValidationError
from router.generations import Generations
from router.handlers.chat_answer import AnswerShape
from router.handlers.choices import Submitted, check_count, submit_all
from router.handlers.common import generations_of, read_json
from router.handlers.openai_common import (
    FINGERPRINT,
    StopTrimmer,
    finish_reason,
    logprob,
    model_name,
    new_id,
    stream_tail,
    trim_stop,
    usage,
    whole_answer,
)
from router.handlers.sse import serve_sse
from router.reasoning.gate import AfterReasoning, first_state
from router.reasoning.text_markers import TextThinkParser
from router.request import ValidRequest
from router.tool_calls.choice import ToolPlan, plan_tools


def token_logprob(gens: Generations, token: Token, top: tuple[Token, ...]) -> dict[str, Any]:
    def one(t: Token, text: str) -> dict[str, Any]:
        return {"token": text, "logprob": logprob(t.logprob), "bytes": list(text.encode())}

    chosen = one(token, gens.tokenizer.piece(token.id))
    return {**chosen, "top_logprobs": [one(t, t.text) for t in top]}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    received = time.monotonic()
    gens = generations_of(request)
    body = parse(ChatRequest, await read_json(request))
    if not gens.tokenizer.has_chat_template:
        raise ValidationError("the model's tokenizer has no chat template; use /v1/completions")
    plan = plan_tools(body, gens.chat)
    messages = [m.for_template(i) for i, m in enumerate(body.messages)]
    _check_template_reads(gens, plan, messages)
    try:
        prompt = await gens.tokenizer.apply_chat_template(
            messages, body.chat_template_kwargs or {}, plan.template_tools
        )
    except (jinja2.TemplateError, ValueError, TypeError, KeyError) as err:
        raise ValidationError(f"`messages` rejected by the model's chat template: {err}") from None
    n = body.n or 1
    check_count(gens, n, "`n`")
    valid = await gens.validate(body.to_request(prompt, plan.grammar))
    shape = _shape(gens, plan, prompt, valid.grammar is not None)
    valid = _after_reasoning(gens, valid, shape)
    with gens.permit(n):
        sent = submit_all(request, [valid], n, received)
        if body.stream:
            stream = ChatStream(gens, sent, body.logprobs, body.include_usage, shape)
            headers = {"x-compute-type": gens.model.device_type or "unknown"}
            return await serve_sse(request, sent.entries, headers, stream)
        finished = await sent.finished()
    choices = [
        _choice(gens, index, entry, finished[entry.id], body.logprobs, shape)
        for index, entry in enumerate(sent.entries)
    ]
    first = sent.entries[0]
    return whole_answer(
        gens,
        first,
        finished[first.id],
        object_type="chat.completion",
        id_prefix="chatcmpl",
        choices=choices,
        usage=usage(sent.firsts, sent.entries),
    )


def _check_template_reads(gens: Generations, plan: ToolPlan, messages: list[dict]) -> None:
    """Tools, and calls in the history, reach the model only through the template: one that
    never reads them would drop them silently, so they are refused instead."""
    tools = plan.template_tools
    if tools and not gens.tokenizer.chat_template_reads("tools", tools):
        raise ValidationError(
            "`tools`: the model's chat template does not render tools, so the model would never "
            "see them; send the request without `tools`, or serve the model with a chat "
            "template that renders them"
        )
    if any("tool_calls" in m for m in messages) and not gens.tokenizer.chat_template_reads(
        "tool_calls", tools
    ):
        raise ValidationError(
            "`messages`: the model's chat template does not render an assistant's `tool_calls`, "
            "so the model would never see those calls"
        )


def _shape(gens: Generations, plan: ToolPlan, prompt: str, constrained: bool) -> AnswerShape:
    reasoning = gens.chat.reasoning
    start = first_state(prompt, reasoning) if reasoning is not None else "answer"
    if constrained and isinstance(reasoning, TextThinkParser):
        # Plain-text markers give a grammar no token to wait for: it constrains the first token,
        # so what comes is the answer (Olmo 3's template opens a block the JSON never closes).
        start = "answer"
    enforced = plan.grammar is not None
    return AnswerShape(reasoning, start, plan.parser, gens.chat.markers, enforced)


def _after_reasoning(gens: Generations, valid: ValidRequest, shape: AnswerShape) -> ValidRequest:
    """With a think-block reasoning parser, a grammar constrains the answer after the block
    (under harmony, which has no gate tokens, from the first token)."""
    tokens = gens.chat.reasoning_tokens
    if valid.grammar is None or shape.reasoning is None or tokens is None:
        return valid
    gate = AfterReasoning(valid.grammar, tokens.start, tokens.end, shape.start)
    return dataclasses.replace(valid, grammar=gate)


def _choice(
    gens: Generations,
    index: int,
    entry: Entry,
    finished: Finished,
    logprobs: bool,
    shape: AnswerShape,
) -> dict[str, Any]:
    text = trim_stop(shape.text(entry.tokens, finished.generated_text), entry.request.stop)
    message = shape.message(text)
    choice = {
        "index": index,
        "message": message,
        "logprobs": None,
        "finish_reason": _finish(finish_reason(finished), "tool_calls" in message),
    }
    if logprobs:
        steps = zip(entry.tokens, entry.top_tokens, strict=True)
        choice["logprobs"] = {"content": [token_logprob(gens, t, top) for t, top in steps]}
    return choice


def _finish(reason: str, called: bool) -> str:
    """OpenAI's `tool_calls` for an answer that ended after making calls; an answer cut by the
    length limit says so, calls or not (its last call may be the one cut, left as text)."""
    return "tool_calls" if called and reason == "stop" else reason


class ChatStream:
    """`chat.completion.chunk` events: per choice (its `index`), the role first, then content,
    then its finish_reason; after the last choice, the usage (if asked) and [DONE]."""

    prefix = b"data: "

    def __init__(
        self,
        gens: Generations,
        sent: Submitted,
        logprobs: bool,
        include_usage: bool,
        shape: AnswerShape,
    ) -> None:
        self.gens, self.sent, self.shape = gens, sent, shape
        self.entries = entries = sent.entries
        self.logprobs, self.include_usage = logprobs, include_usage
        self.id, self.created = new_id("chatcmpl"), int(time.time())
        self.trimmers = [StopTrimmer(e.request.stop) for e in entries]
        self.started = [False] * len(entries)
        self.answers = [shape.stream() for _ in entries]

    def chunk(
        self, index: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None
    ) -> dict:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": model_name(self.gens, self.entries[0]),
            "system_fingerprint": FINGERPRINT,
            "choices": [
                {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            ],
        }
        if self.include_usage:
            out["usage"] = None  # only the last chunk carries it
        return out

    def on_token(self, index: int, event: TokenEvent) -> list[Any]:
        out = []
        if not self.started[index]:
            self.started[index] = True
            out.append(self.chunk(index, {"role": "assistant", "content": ""}))
        trimmer, answer = self.trimmers[index], self.answers[index]
        text = trimmer.push(self.shape.piece(event.token))
        if event.end is not None:
            text += trimmer.flush()
        deltas = answer.push(text)
        if event.end is not None:
            deltas += answer.finish()
        if self.logprobs:
            lp = {"content": [token_logprob(self.gens, event.token, event.top_tokens)]}
            # The token's logprobs ride on its first delta (an empty one while text is held).
            first = deltas[0] if deltas else {"content": ""}
            out.append(self.chunk(index, first, lp))
            deltas = deltas[1:]
        out += [self.chunk(index, delta) for delta in deltas]
        if event.end is not None:
            finish = _finish(finish_reason(event.end), answer.called)
            out.append(self.chunk(index, {}, finish=finish))
        return out

    def on_error(self, error: RouterError) -> list[Any]:
        return [error.to_json(self.entries[0].request_id)]

    def on_end(self) -> list[Any]:
        return stream_tail(self.chunk(0, {}), self.include_usage, self.sent.firsts, self.entries)
