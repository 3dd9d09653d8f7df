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
from router.handlers.common import (
    generations_of,
    read_json,
    submit,
    timing_headers,
    wait_finished,
)
from router.handlers.openai_common import (
    FINGERPRINT,
    StopTrimmer,
    finish_reason,
    logprob,
    model_name,
    new_id,
    response_body,
    trim_stop,
    usage,
    visible,
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
    valid = await gens.validate(body.to_request(prompt))
    with gens.permit():
        entry = submit(request, valid, received)
        if body.stream:
            stream = ChatStream(gens, entry, body.logprobs, body.include_usage)
            headers = {"x-compute-type": gens.model.device_type or "unknown"}
            return await serve_sse(request, entry, headers, stream)
        try:
            finished = await wait_finished(entry)
        finally:
            if not entry.done:
                entry.cancel()
    content = trim_stop(finished.generated_text, valid.stop)
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "logprobs": None,
        "finish_reason": finish_reason(finished),
    }
    if body.logprobs:
        steps = zip(entry.tokens, entry.top_tokens, strict=True)
        choice["logprobs"] = {"content": [token_logprob(gens, t, top) for t, top in steps]}
    body = response_body(
        gens, entry, object_type="chat.completion", id_prefix="chatcmpl", choice=choice
    )
    return web.json_response(body, headers=timing_headers(gens, entry, finished))


class ChatStream:
    """`chat.completion.chunk` events: the role first, then content, then finish_reason."""

    prefix = b"data: "

    def __init__(
        self, gens: Generations, entry: Entry, logprobs: bool, include_usage: bool
    ) -> None:
        self.gens, self.entry = gens, entry
        self.logprobs, self.include_usage = logprobs, include_usage
        self.id, self.created = new_id("chatcmpl"), int(time.time())
        self.trimmer = StopTrimmer(entry.request.stop)
        self.started = False
        self.finished: Finished | None = None

    def chunk(self, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": model_name(self.gens, self.entry),
            "system_fingerprint": FINGERPRINT,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            ],
        }
        if self.include_usage:
            out["usage"] = None  # only the last chunk carries it
        return out

    def on_token(self, event: TokenEvent) -> list[Any]:
        out = []
        if not self.started:
            self.started = True
            out.append(self.chunk({"role": "assistant", "content": ""}))
        text = self.trimmer.push(visible(event.token))
        if event.end is not None:
            self.finished = event.end
            text += self.trimmer.flush()
        lp = None
        if self.logprobs:
            lp = {"content": [token_logprob(self.gens, event.token, event.top_tokens)]}
        if text or lp:
            out.append(self.chunk({"content": text}, lp))
        return out

    def on_error(self, error: RouterError) -> list[Any]:
        return [error.to_json(self.entry.request_id)]

    def on_end(self) -> list[Any]:
        assert self.finished is not None
        out: list[Any] = [self.chunk({}, finish=finish_reason(self.finished))]
        if self.include_usage:
            out.append({**self.chunk({}), "choices": [], "usage": usage(self.entry)})
        return [*out, "[DONE]"]
