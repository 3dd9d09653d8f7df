"""POST /v1/completions: OpenAI's (legacy) text completion API."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from router.api.openai import CompletionRequest
from router.api.parsing import parse
from router.detokenizer import IncrementalDetokenizer
from router.entry import Entry, Finished, Token, TokenEvent
from router.errors import RouterError
from router.generations import Generations
from router.handlers.choices import Submitted, check_count, most_likely, submit_all
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


def logprobs_json(
    gens: Generations,
    tokens: list[tuple[Token, tuple[Token, ...], str]],
    offset: int,
    end: int | None = None,
) -> dict[str, list[Any]]:
    """The legacy logprobs object for (token, alternatives, visible text) triples, the first
    at `offset` in the choice's text; offsets past `end` are clamped to it."""
    offsets = []
    for _token, _top, text in tokens:
        offsets.append(offset if end is None else min(offset, end))
        offset += len(text)
    return {
        "tokens": [gens.tokenizer.piece(t.id) for t, _top, _text in tokens],
        # null for an echoed prompt's first token, as vLLM and OpenAI answer
        "token_logprobs": [
            None if t.logprob is None else logprob(t.logprob) for t, _top, _text in tokens
        ],
        "top_logprobs": [
            None if t.logprob is None else {a.text: logprob(a.logprob) for a in top}
            for t, top, _text in tokens
        ],
        "text_offset": offsets,
    }


def prompt_logprobs(gens: Generations, entry: Entry) -> dict[str, list[Any]]:
    """`echo`'s prompt tokens (the first has no logprob: nothing predicts it). Each token's
    offset counts the text the tokens before it decode to: a character split over byte tokens
    comes with its last one, special tokens add none, as in the generated text. The echoed
    prompt is the one sent, which that decoding may not rebuild exactly: offsets stay in it."""
    detokenizer, tops = IncrementalDetokenizer(gens.tokenizer), entry.prefill_top
    triples = [
        (t, tops[i] if i < len(tops) else (), detokenizer.push(t.id))
        for i, t in enumerate(entry.prefill)
    ]
    return logprobs_json(gens, triples, 0, end=len(echoed(entry)))


def joined(head: dict[str, list[Any]], tail: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {key: head[key] + tail[key] for key in head}


def echoed(entry: Entry) -> str:
    return entry.request.inputs


async def completions(request: web.Request) -> web.StreamResponse:
    received = time.monotonic()
    gens = generations_of(request)
    body = parse(CompletionRequest, await read_json(request))
    candidates, n = body.candidates(), body.n or 1
    check_count(gens, len(body.prompt) * candidates, "`prompt` × `best_of`/`n`")
    prompts = [await gens.validate(r) for r in body.to_requests()]
    with gens.permit(len(prompts) * candidates):
        sent = submit_all(request, prompts, candidates, received)
        if body.stream:
            stream = CompletionStream(
                gens, sent, body.logprobs is not None, body.include_usage, bool(body.echo)
            )
            headers = {"x-compute-type": gens.model.device_type or "unknown"}
            return await serve_sse(request, sent.entries, headers, stream)
        finished = await sent.finished()
    chosen = [e for group in sent.candidates for e in most_likely(group, n)]
    choices = [
        _choice(gens, index, entry, finished[entry.id], body.logprobs is not None, bool(body.echo))
        for index, entry in enumerate(chosen)
    ]
    first = chosen[0]
    return whole_answer(
        gens,
        first,
        finished[first.id],
        object_type="text_completion",
        id_prefix="cmpl",
        choices=choices,
        usage=usage(sent.firsts, chosen),
    )


def _choice(
    gens: Generations, index: int, entry: Entry, finished: Finished, logprobs: bool, echo: bool
) -> dict[str, Any]:
    text = trim_stop(finished.generated_text, entry.request.stop)
    lp = None
    if logprobs:
        triples = [
            (t, top, visible(t)) for t, top in zip(entry.tokens, entry.top_tokens, strict=True)
        ]
        lp = logprobs_json(gens, triples, len(echoed(entry)) if echo else 0)
        if echo:
            lp = joined(prompt_logprobs(gens, entry), lp)
    return {
        "index": index,
        "text": echoed(entry) + text if echo else text,
        "logprobs": lp,
        "finish_reason": finish_reason(finished),
    }


class CompletionStream:
    """`text_completion` events: per choice (its `index`), one per token with text (`echo`: the
    prompt first, in the choice's first event), then one with its finish_reason; after the
    last choice, the usage (if asked) and [DONE]."""

    prefix = b"data: "

    def __init__(
        self,
        gens: Generations,
        sent: Submitted,
        logprobs: bool,
        include_usage: bool,
        echo: bool,
    ) -> None:
        self.gens, self.sent = gens, sent
        self.entries = entries = sent.entries
        self.logprobs, self.include_usage, self.echo = logprobs, include_usage, echo
        self.id, self.created = new_id("cmpl"), int(time.time())
        self.trimmers = [StopTrimmer(e.request.stop) for e in entries]
        self.offsets = [0] * len(entries)
        self.started = [False] * len(entries)

    def chunk(self, index: int, text: str, logprobs: Any = None, finish: str | None = None) -> dict:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": model_name(self.gens, self.entries[0]),
            "system_fingerprint": FINGERPRINT,
            "choices": [
                {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
            ],
        }
        if self.include_usage:
            out["usage"] = None  # only the last chunk carries it
        return out

    def on_token(self, index: int, event: TokenEvent) -> list[Any]:
        entry, text, head = self.entries[index], "", None
        if self.echo and not self.started[index]:  # the prompt, with the choice's first chunk
            text = echoed(entry)
            self.offsets[index] = len(text)
            head = prompt_logprobs(self.gens, entry) if self.logprobs else None
        self.started[index] = True
        generated = self.trimmers[index].push(visible(event.token))
        if event.end is not None:
            generated += self.trimmers[index].flush()
        text += generated
        lp = None
        if self.logprobs:
            triple = (event.token, event.top_tokens, generated)
            lp = logprobs_json(self.gens, [triple], self.offsets[index])
            lp = lp if head is None else joined(head, lp)
        self.offsets[index] += len(generated)
        out = [self.chunk(index, text, lp)] if text or lp else []
        if event.end is not None:
            out.append(self.chunk(index, "", finish=finish_reason(event.end)))
        return out

    def on_error(self, error: RouterError) -> list[Any]:
        return [error.to_json(self.entries[0].request_id)]

    def on_end(self) -> list[Any]:
        # A stream answers every candidate (best_of == n).
        return stream_tail(self.chunk(0, ""), self.include_usage, self.sent.firsts, self.entries)
