"""What /v1/completions and /v1/chat/completions share in their answers (their bodies are
parsed by router/api/openai.py and router/api/chat.py)."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

from aiohttp import web

import router
from router.entry import Entry, Finished, Token
from router.generations import Generations
from router.handlers.common import timing_headers


def finish_reason(finished: Finished) -> str:
    """ "stop" whenever the EOS token or a stop sequence ended the text, also on the last
    allowed token (as vLLM: the text is cut there); "length" only when the limit alone did."""
    return "stop" if finished.stopped else "length"


FINGERPRINT = f"switchyard-{router.__version__}"
# What OpenAI reports for a logprob it cannot give (JSON has no -inf).
UNKNOWN_LOGPROB = -9999.0


def model_name(gens: Generations, entry: Entry) -> str:
    """What answers report as `model`: the adapter asked for, else the served model."""
    return entry.request.adapter_id or gens.model.model_id


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def whole_answer(
    gens: Generations,
    entry: Entry,
    finished: Finished,
    *,
    object_type: str,
    id_prefix: str,
    choices: list[dict[str, Any]],
    usage: dict[str, Any],
) -> web.Response:
    """A non-streamed OpenAI answer: the envelope around its choices, with the timing headers
    of `entry` (its first choice)."""
    body = {
        "id": new_id(id_prefix),
        "object": object_type,
        "created": int(time.time()),
        "model": model_name(gens, entry),
        "system_fingerprint": FINGERPRINT,
        "choices": choices,
        "usage": usage,
    }
    return web.json_response(body, headers=timing_headers(gens, entry, finished))


def stream_tail(
    envelope: dict[str, Any],
    include_usage: bool,
    prompts: Sequence[Entry],
    choices: Sequence[Entry],
) -> list[Any]:
    """What ends an OpenAI stream: with `include_usage`, a chunk of no choice holding the usage
    (`envelope`: any chunk of the stream), then [DONE]."""
    if not include_usage:
        return ["[DONE]"]
    return [{**envelope, "choices": [], "usage": usage(prompts, choices)}, "[DONE]"]


def usage(prompts: Sequence[Entry], choices: Sequence[Entry]) -> dict[str, Any]:
    """Each prompt counts once however many choices it has (as vLLM counts); `prompts` holds
    one entry of each. Completion tokens are those of the choices answered."""
    prompt = sum(e.request.input_length for e in prompts)
    completion = sum(len(e.generated_ids) for e in choices)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        # OpenAI's field: prompt tokens served from the prefix cache.
        "prompt_tokens_details": {"cached_tokens": sum(e.cached_tokens for e in prompts)},
    }


def logprob(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else UNKNOWN_LOGPROB


def visible(token: Token) -> str:
    """Streamed text: special tokens (EOS) are left out, as in the non-streamed text."""
    return token.content


class StopTrimmer:
    """OpenAI's text ends before the stop sequence (TGI's includes it).

    Streams hold back any tail that could still grow into a stop sequence, so nothing past the
    cut is ever sent; the non-streamed text goes through the same object so both agree.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._pending = ""
        self._cut = False

    def push(self, text: str) -> str:
        if self._cut:
            return ""
        self._pending += text
        hits = [i for i in (self._pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self._pending, self._cut = self._pending[: min(hits)], "", True
            return out
        keep = self._partial_stop_suffix()
        split = len(self._pending) - keep
        out, self._pending = self._pending[:split], self._pending[split:]
        return out

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return "" if self._cut else out

    def _partial_stop_suffix(self) -> int:
        longest = min(len(self._pending), max((len(s) for s in self.stops), default=1) - 1)
        for k in range(longest, 0, -1):
            tail = self._pending[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0


def trim_stop(text: str, stops: Sequence[str]) -> str:
    trimmer = StopTrimmer(stops)
    return trimmer.push(text) + trimmer.flush()
