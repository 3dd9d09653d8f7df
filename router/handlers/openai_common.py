"""What /v1/completions and /v1/chat/completions share: field checks, the mapping onto TGI's
generate parameters, and the pieces of their answers.

As in TGI's OpenAI layer, a request becomes a TGI generate request checked by the same Validator;
its messages are rewritten to name the OpenAI field the client actually sent. Unlike TGI, which
ignores unknown fields, an unknown field is a 422 (the OpenAI API refuses them too): a typo must
not silently change what is generated. Features the shards cannot honour (n > 1, logit_bias,
presence_penalty, tools...) are a 422 saying so, never silently dropped.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import router
from router.adapters import AdapterRegistry
from router.entry import Entry, Token
from router.errors import ValidationError
from router.infer import Infer
from router.request import ValidRequest
from router.stopping import FinishReason
from router.validation import Fields, reject_unknown

FINISH_REASON = {
    FinishReason.LENGTH: "length",
    FinishReason.EOS_TOKEN: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
}
FINGERPRINT = f"switchyard-{router.__version__}"
# What OpenAI reports for a logprob it cannot give (JSON has no -inf).
UNKNOWN_LOGPROB = -9999.0
# Accepted and ignored: they do not change what is generated.
IGNORED_FIELDS = frozenset(
    {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
     "prompt_cache_retention", "parallel_tool_calls"}
)  # fmt: skip
# Both routes; `ignore_eos`, `top_k`, `repetition_penalty` and `min_p` are vLLM's extensions.
SHARED_FIELDS = frozenset(
    {"model", "frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "max_tokens",
     "n", "seed", "stop", "stream", "stream_options", "temperature", "top_p", "ignore_eos",
     "top_k", "repetition_penalty", "min_p"}
)  # fmt: skip


@dataclass(frozen=True)
class OpenAIParams:
    generate: dict[str, Any]  # TGI's `parameters`
    stream: bool
    include_usage: bool
    ignore_eos: bool


def check_fields(payload: dict[str, Any], allowed: frozenset[str]) -> None:
    reject_unknown(payload, allowed | IGNORED_FIELDS)


def reject_unless(payload: dict[str, Any], name: str, harmless: bool, why: str = "") -> None:
    """A 422 for a feature the server does not implement, unless its value changes nothing."""
    if payload.get(name) is not None and not harmless:
        raise ValidationError(f"`{name}` is not supported{why}")


def parse_shared(payload: dict[str, Any], adapters: AdapterRegistry) -> OpenAIParams:
    f = Fields(payload)
    # The base model or a LoRA adapter (404 for an unknown name once adapters are loaded).
    adapter_id = adapters.model(f.string("model"))
    n = f.integer("n")
    if n is not None and n != 1:
        raise ValidationError(f"`n` must be 1 (one choice per request). Given: {n}")
    presence = f.number("presence_penalty")
    reject_unless(payload, "presence_penalty", presence == 0.0, "; use `frequency_penalty`")
    bias = payload.get("logit_bias")
    reject_unless(payload, "logit_bias", bias == {})
    # Sent as 0 by clients following e.g. Qwen3's recommended settings: that is "off".
    reject_unless(payload, "min_p", f.number("min_p") == 0.0, "; only 0 (off)")
    temperature = f.number("temperature")
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        raise ValidationError(f"`temperature` must be >= 0.0 and <= 2.0. Given: {temperature}")
    top_p = f.number("top_p")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValidationError(f"`top_p` must be > 0.0 and <= 1.0. Given: {top_p}")
    f.integer("top_k")
    stream = f.boolean("stream", False)
    include_usage = _include_usage(payload.get("stream_options"), stream)

    params: dict[str, Any] = {"adapter_id": adapter_id} if adapter_id else {}
    # OpenAI samples by default; temperature 0 means greedy (exact argmax), whatever else is set.
    if temperature is None or temperature > 0.0:
        params["do_sample"] = True
        if temperature is not None:
            params["temperature"] = temperature
        if top_p is not None and top_p < 1.0:  # 1.0 is OpenAI's "off"; TGI refuses it
            params["top_p"] = top_p
        if payload.get("top_k") is not None:
            params["top_k"] = payload["top_k"]
    for name in ("frequency_penalty", "repetition_penalty", "seed"):
        if payload.get(name) is not None:
            params[name] = payload[name]  # types and ranges: the Validator's checks
    stop = payload.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        params["stop"] = stop
    return OpenAIParams(params, stream, include_usage, f.boolean("ignore_eos", False))


def _include_usage(options: Any, stream: bool) -> bool:
    if options is None:
        return False
    if not stream:
        raise ValidationError("`stream_options` is only allowed when `stream` is true")
    if not isinstance(options, dict):
        raise ValidationError("`stream_options` must be a JSON object")
    check_fields(options, frozenset({"include_usage", "include_obfuscation"}))
    return Fields(options).boolean("include_usage", False)


def max_tokens_param(payload: dict[str, Any], names: Sequence[str], params: dict[str, Any]) -> str:
    """Puts the first given of `names` into max_new_tokens; returns the name to report."""
    f = Fields(payload)
    for name in names:
        value = f.integer(name)
        if value is not None:
            params["max_new_tokens"] = value
            return name
    return names[0]


async def validate(
    infer: Infer,
    inputs: str,
    shared: OpenAIParams,
    renames: dict[str, str],
    add_special_tokens: bool = True,
) -> ValidRequest:
    """TGI's validation; its messages name the OpenAI fields (`renames`: TGI name -> ours)."""
    payload = {"inputs": inputs, "parameters": shared.generate}
    payload["add_special_tokens"] = add_special_tokens
    try:
        valid = await infer.validator.validate(payload, stream=False)
    except ValidationError as err:
        text = str(err)
        for old, new in renames.items():
            text = text.replace(f"`{old}`", f"`{new}`")
        raise ValidationError(text) from None
    return replace(valid, ignore_eos=shared.ignore_eos)


def model_name(infer: Infer, entry: Entry) -> str:
    """What answers report as `model`: the adapter asked for, else the served model."""
    return entry.request.adapter_id or infer.model.model_id


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def response_body(
    infer: Infer, entry: Entry, *, object_type: str, id_prefix: str, choice: dict[str, Any]
) -> dict[str, Any]:
    """The envelope every non-streamed OpenAI answer shares around its one choice."""
    return {
        "id": new_id(id_prefix),
        "object": object_type,
        "created": int(time.time()),
        "model": model_name(infer, entry),
        "system_fingerprint": FINGERPRINT,
        "choices": [choice],
        "usage": usage(entry),
    }


def usage(entry: Entry) -> dict[str, Any]:
    prompt, completion = entry.request.input_length, len(entry.generated_ids)
    total = prompt + completion
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        # OpenAI's field: prompt tokens served from the prefix cache.
        "prompt_tokens_details": {"cached_tokens": entry.cached_tokens},
    }


def logprob(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else UNKNOWN_LOGPROB


def visible(token: Token) -> str:
    """Streamed text: special tokens (EOS) are left out, as in the non-streamed text."""
    return "" if token.special else token.text


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
