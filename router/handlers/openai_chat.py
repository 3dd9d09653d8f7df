"""POST /v1/chat/completions: OpenAI's chat API over the tokenizer's own chat template."""

from __future__ import annotations

import time
from typing import Any

import jinja2
from aiohttp import web

from router.api.chat import ChatRequest
from router.api.parsing import parse
from router.entry import Entry, Finished, Token, TokenEvent
from router.errors import RouterError, ValidationError
from router.generations import Generations
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
    visible,
    whole_answer,
)
from router.handlers.sse import serve_sse


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
    messages = [{"role": m.role, "content": m.content} for m in body.messages]
    try:
        prompt = await gens.tokenizer.apply_chat_template(messages, body.chat_template_kwargs or {})
    except (jinja2.TemplateError, ValueError, TypeError, KeyError) as err:
        raise ValidationError(f"`messages` rejected by the model's chat template: {err}") from None
    n = body.n or 1
    check_count(gens, n, "`n`")
    valid = await gens.validate(body.to_request(prompt))
    with gens.permit(n):
        sent = submit_all(request, [valid], n, received)
        if body.stream:
            stream = ChatStream(gens, sent, body.logprobs, body.include_usage)
            headers = {"x-compute-type": gens.model.device_type or "unknown"}
            return await serve_sse(request, sent.entries, headers, stream)
        finished = await sent.finished()
    choices = [
        _choice(gens, index, entry, finished[entry.id], body.logprobs)
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


def _choice(
    gens: Generations, index: int, entry: Entry, finished: Finished, logprobs: bool
) -> dict[str, Any]:
    content = trim_stop(finished.generated_text, entry.request.stop)
    choice = {
        "index": index,
        "message": {"role": "assistant", "content": content},
        "logprobs": None,
        "finish_reason": finish_reason(finished),
    }
    if logprobs:
        steps = zip(entry.tokens, entry.top_tokens, strict=True)
        choice["logprobs"] = {"content": [token_logprob(gens, t, top) for t, top in steps]}
    return choice


class ChatStream:
    """`chat.completion.chunk` events: per choice (its `index`), the role first, then content,
    then its finish_reason; after the last choice, the usage (if asked) and [DONE]."""

    prefix = b"data: "

    def __init__(
        self, gens: Generations, sent: Submitted, logprobs: bool, include_usage: bool
    ) -> None:
        self.gens, self.sent = gens, sent
        self.entries = entries = sent.entries
        self.logprobs, self.include_usage = logprobs, include_usage
        self.id, self.created = new_id("chatcmpl"), int(time.time())
        self.trimmers = [StopTrimmer(e.request.stop) for e in entries]
        self.started = [False] * len(entries)

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
        text = self.trimmers[index].push(visible(event.token))
        if event.end is not None:
            text += self.trimmers[index].flush()
        lp = None
        if self.logprobs:
            lp = {"content": [token_logprob(self.gens, event.token, event.top_tokens)]}
        if text or lp:
            out.append(self.chunk(index, {"content": text}, lp))
        if event.end is not None:
            out.append(self.chunk(index, {}, finish=finish_reason(event.end)))
        return out

    def on_error(self, error: RouterError) -> list[Any]:
        return [error.to_json(self.entries[0].request_id)]

    def on_end(self) -> list[Any]:
        return stream_tail(self.chunk(0, {}), self.include_usage, self.sent.firsts, self.entries)
