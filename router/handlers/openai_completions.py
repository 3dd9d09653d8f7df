"""POST /v1/completions: OpenAI's (legacy) text completion API."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from router.api.openai import CompletionRequest
from router.api.parsing import parse
from router.entry import Entry, Finished, Token, TokenEvent
from router.errors import RouterError
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


def logprobs_json(
    gens: Generations, tokens: list[tuple[Token, tuple[Token, ...], str]], offset: int
):
    """The legacy logprobs object for (token, alternatives, visible text) triples."""
    offsets = []
    for _token, _top, text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": [gens.tokenizer.piece(t.id) for t, _top, _text in tokens],
        "token_logprobs": [logprob(t.logprob) for t, _top, _text in tokens],
        "top_logprobs": [{a.text: logprob(a.logprob) for a in top} for _t, top, _text in tokens],
        "text_offset": offsets,
    }


async def completions(request: web.Request) -> web.StreamResponse:
    received = time.monotonic()
    gens = generations_of(request)
    body = parse(CompletionRequest, await read_json(request))
    valid = await gens.validate(body.to_request())
    with gens.permit():
        entry = submit(request, valid, received)
        if body.stream:
            stream = CompletionStream(gens, entry, body.logprobs is not None, body.include_usage)
            headers = {"x-compute-type": gens.model.device_type or "unknown"}
            return await serve_sse(request, entry, headers, stream)
        try:
            finished = await wait_finished(entry)
        finally:
            if not entry.done:
                entry.cancel()
    lp = None
    if body.logprobs is not None:
        triples = [
            (t, top, visible(t)) for t, top in zip(entry.tokens, entry.top_tokens, strict=True)
        ]
        lp = logprobs_json(gens, triples, 0)
    choice = {
        "index": 0,
        "text": trim_stop(finished.generated_text, valid.stop),
        "logprobs": lp,
        "finish_reason": finish_reason(finished),
    }
    body = response_body(
        gens, entry, object_type="text_completion", id_prefix="cmpl", choice=choice
    )
    return web.json_response(body, headers=timing_headers(gens, entry, finished))


class CompletionStream:
    """`text_completion` events: one per token with text, then one with finish_reason."""

    prefix = b"data: "

    def __init__(
        self, gens: Generations, entry: Entry, logprobs: bool, include_usage: bool
    ) -> None:
        self.gens, self.entry = gens, entry
        self.logprobs, self.include_usage = logprobs, include_usage
        self.id, self.created = new_id("cmpl"), int(time.time())
        self.trimmer = StopTrimmer(entry.request.stop)
        self.offset = 0
        self.finished: Finished | None = None

    def chunk(self, text: str, logprobs: Any = None, finish: str | None = None) -> dict:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": model_name(self.gens, self.entry),
            "system_fingerprint": FINGERPRINT,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        }
        if self.include_usage:
            out["usage"] = None  # only the last chunk carries it
        return out

    def on_token(self, event: TokenEvent) -> list[Any]:
        text = self.trimmer.push(visible(event.token))
        if event.end is not None:
            self.finished = event.end
            text += self.trimmer.flush()
        lp = None
        if self.logprobs:
            lp = logprobs_json(self.gens, [(event.token, event.top_tokens, text)], self.offset)
        self.offset += len(text)
        return [self.chunk(text, lp)] if text or lp else []

    def on_error(self, error: RouterError) -> list[Any]:
        return [error.to_json(self.entry.request_id)]

    def on_end(self) -> list[Any]:
        assert self.finished is not None
        out: list[Any] = [self.chunk("", finish=finish_reason(self.finished))]
        if self.include_usage:
            out.append({**self.chunk(""), "choices": [], "usage": usage(self.entry)})
        return [*out, "[DONE]"]
