"""TGI's JSON response shapes, built from an entry's results.

Field presence follows TGI's serde attributes: /generate omits `details` unless asked for,
`top_tokens` and `best_of_sequences` are omitted when empty, NaN logprobs become null. One
deviation: the last stream event always carries its details (TGI: only with `details`).
"""

from __future__ import annotations

import math
from typing import Any

from router.entry import Entry, Finished, Token


def token_json(token: Token) -> dict[str, Any]:
    logprob = token.logprob
    if logprob is not None and not math.isfinite(logprob):
        logprob = None
    return {"id": token.id, "text": token.text, "logprob": logprob, "special": token.special}


def prefill_json(token: Token) -> dict[str, Any]:
    out = token_json(token)
    del out["special"]  # TGI's PrefillToken has no `special`
    return out


def output_text(entry: Entry, finished: Finished) -> str:
    if entry.request.return_full_text:
        return entry.request.inputs + finished.generated_text
    return finished.generated_text


def sequence_details(entry: Entry, finished: Finished) -> dict[str, Any]:
    out: dict[str, Any] = {
        "finish_reason": finished.finish_reason.value,
        "generated_tokens": finished.generated_tokens,
        "seed": finished.seed,
        "prefill": [prefill_json(t) for t in entry.prefill],
        "tokens": [token_json(t) for t in entry.tokens],
    }
    if entry.request.top_n_tokens:
        out["top_tokens"] = [[token_json(t) for t in step] for step in entry.top_tokens]
    return out


def generate_json(
    entry: Entry, finished: Finished, best_of: list[tuple[Entry, Finished]] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"generated_text": output_text(entry, finished)}
    req = entry.request
    if req.details or req.decoder_input_details:
        details = sequence_details(entry, finished)
        if best_of:
            details["best_of_sequences"] = [
                {"generated_text": output_text(e, f), **sequence_details(e, f)} for e, f in best_of
            ]
        out["details"] = details
    return out


def stream_json(
    entry: Entry, index: int, token: Token, top: tuple[Token, ...], finished: Finished | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"index": index, "token": token_json(token)}
    if top:
        out["top_tokens"] = [token_json(t) for t in top]
    out["generated_text"] = output_text(entry, finished) if finished is not None else None
    details = None
    # TGI sends these only when `details` was asked for; they are cheap and clients (ours and
    # the integration tests) read them, so the last event always carries them.
    if finished is not None:
        details = {
            "finish_reason": finished.finish_reason.value,
            "generated_tokens": finished.generated_tokens,
            "seed": finished.seed,
            "input_length": entry.request.input_length,
        }
    out["details"] = details
    return out
