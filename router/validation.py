"""Request validation with TGI's semantics and messages (422 naming the field and the limit).

Checks run in TGI's order (so the same bad request gets the same first error), except that
a too-long prompt is reported before the total-length check. Malformed JSON
and wrongly typed fields are 422 as well, with a message naming the field. Unlike TGI, which
ignores unknown fields, an unknown field is a 422 naming it, as on the OpenAI routes: a typo such
as `max_new_token` must not silently fall back to the default length.
"""

from __future__ import annotations

import difflib
import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from router.adapters import AdapterRegistry
from router.errors import ValidationError
from router.request import SamplingParams, ValidRequest
from router.tokenizer import Tokenizer

# TGI: without max_new_tokens, generate up to the context limit, at most this many tokens.
DEFAULT_GENERATION_LENGTH = 1024
MAX_TOP_N_TOKENS = 5
U64_MAX = 2**64 - 1
# Every step scans a window as long as the longest stop sequence: bound it so one request cannot
# make every step of the batch slow (TGI has no such bound; no real stop sequence comes close).
MAX_STOP_SEQUENCE_CHARS = 1024


# TGI's GenerateRequest (CompatGenerateRequest adds `stream`) and GenerateParameters.
REQUEST_FIELDS = frozenset({"inputs", "parameters", "add_special_tokens", "stream"})
PARAMETER_FIELDS = frozenset(
    {"best_of", "temperature", "repetition_penalty", "frequency_penalty", "top_k", "top_p",
     "typical_p", "do_sample", "max_new_tokens", "return_full_text", "stop", "truncate",
     "watermark", "details", "decoder_input_details", "seed", "top_n_tokens", "grammar",
     "adapter_id"}
)  # fmt: skip


def reject_unknown(obj: dict[str, Any], known: Iterable[str], parent: str = "") -> None:
    """A 422 naming the first field not in `known` (and the known one it most resembles)."""
    known = frozenset(known)
    for name in obj:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            raise ValidationError(f"unknown field `{parent}{name}`{hint}")


@dataclass(frozen=True)
class ValidationLimits:
    max_input_tokens: int
    max_total_tokens: int
    max_stop_sequences: int = 4
    max_best_of: int = 2
    max_top_n_tokens: int = MAX_TOP_N_TOKENS


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_body(body: bytes) -> dict[str, Any]:
    """The request body as an object; NaN and Infinity are rejected like any invalid JSON."""
    try:
        payload = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValidationError(f"request body is not valid JSON: {err}") from None
    if not isinstance(payload, dict):
        raise ValidationError("request body must be a JSON object")
    return payload


class Fields:
    """Typed access to a JSON object; a wrong type is a 422 naming the field."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj

    def _get(self, name: str) -> Any:
        return self.obj.get(name)

    def _bad(self, name: str, kind: str) -> ValidationError:
        return ValidationError(f"`{name}` must be {kind}, got {json.dumps(self.obj[name])}")

    def number(self, name: str) -> float | None:
        v = self._get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self._bad(name, "a number")
        return float(v)

    def integer(self, name: str, low: int | None = None) -> int | None:
        v = self._get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._bad(name, "an integer")
        if low is not None and v < low:
            raise self._bad(name, f"an integer >= {low}")
        return v

    def boolean(self, name: str, default: bool) -> bool:
        v = self._get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self._bad(name, "a boolean")
        return v

    def string(self, name: str) -> str | None:
        v = self._get(name)
        if v is None:
            return None
        if not isinstance(v, str):
            raise self._bad(name, "a string")
        return v

    def strings(self, name: str) -> list[str]:
        v = self._get(name)
        if v is None:
            return []
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise self._bad(name, "a list of strings")
        return v


class Validator:
    def __init__(
        self,
        tokenizer: Tokenizer,
        limits: ValidationLimits,
        adapters: AdapterRegistry | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.adapters = adapters or AdapterRegistry((), "")

    async def validate(self, payload: dict[str, Any], *, stream: bool = False) -> ValidRequest:
        """`stream`: whether the route streams; a `stream` field must agree with it."""
        reject_unknown(payload, REQUEST_FIELDS)
        top = Fields(payload)
        if top.boolean("stream", stream) != stream:
            raise ValidationError(
                "`stream` is true: streams come from /generate_stream (or from / with `stream`)"
                if not stream
                else "`stream` is false: single answers come from /generate"
            )
        if "inputs" not in payload:
            raise ValidationError("missing field `inputs`")
        inputs = top.string("inputs")
        if inputs is None:
            raise ValidationError("`inputs` must be a string, got null")
        add_special_tokens = top.boolean("add_special_tokens", True)
        raw_params = payload.get("parameters")
        if raw_params is None:
            raw_params = {}
        if not isinstance(raw_params, dict):
            raise ValidationError("`parameters` must be a JSON object")
        reject_unknown(raw_params, PARAMETER_FIELDS, parent="parameters.")
        p = Fields(raw_params)

        # Deserialization: every field has the right type before any semantic check.
        best_of = p.integer("best_of", low=0)
        temperature = p.number("temperature")
        repetition_penalty = p.number("repetition_penalty")
        frequency_penalty = p.number("frequency_penalty")
        top_k = p.integer("top_k")
        top_p = p.number("top_p")
        typical_p = p.number("typical_p")
        do_sample = p.boolean("do_sample", False)
        max_new_tokens = p.integer("max_new_tokens")
        return_full_text = p.boolean("return_full_text", False)
        stop = p.strings("stop")
        truncate = p.integer("truncate")
        watermark = p.boolean("watermark", False)
        details = p.boolean("details", False)
        decoder_input_details = p.boolean("decoder_input_details", False)
        seed = p.integer("seed", low=0)
        top_n_tokens = p.integer("top_n_tokens")
        adapter_id = p.string("adapter_id") or ""
        if seed is not None and seed > U64_MAX:
            raise ValidationError(f"`seed` must fit in 64 bits, got {seed}")

        lim = self.limits
        if best_of is not None:
            if lim.max_best_of == 1 and best_of != 1:
                raise ValidationError("`best_of` != 1 is not allowed for this endpoint")
            if best_of == 0 or best_of > lim.max_best_of:
                raise ValidationError(
                    f"`best_of` must be > 0 and <= {lim.max_best_of}. Given: {best_of}"
                )
        best_of = best_of or 1
        if stream and best_of != 1:
            raise ValidationError("`best_of` != 1 is not supported when streaming tokens")
        if stream and decoder_input_details:
            raise ValidationError(
                "`decoder_input_details` == true is not supported when streaming tokens"
            )
        sampling_asked = do_sample or any(
            v is not None for v in (temperature, top_k, top_p, typical_p)
        )
        if best_of > 1 and not sampling_asked:
            raise ValidationError("you must use sampling when `best_of` is > 1")

        temperature = 1.0 if temperature is None else temperature
        if temperature <= 0.0:
            raise ValidationError("`temperature` must be strictly positive")
        repetition_penalty = 1.0 if repetition_penalty is None else repetition_penalty
        if repetition_penalty <= 0.0:
            raise ValidationError("`repetition_penalty` must be strictly positive")
        frequency_penalty = 0.0 if frequency_penalty is None else frequency_penalty
        if not -2.0 <= frequency_penalty <= 2.0:
            raise ValidationError("`frequency_penalty` must be >= -2.0 and <= 2.0")
        # 1.0 is the "disabled" value on the wire, but not a valid value to ask for.
        if top_p is not None and not 0.0 < top_p < 1.0:
            raise ValidationError("`top_p` must be > 0.0 and < 1.0")
        if typical_p is not None and not 0.0 < typical_p < 1.0:
            raise ValidationError("`typical_p` must be > 0.0 and < 1.0")
        if top_k is not None and top_k <= 0:
            raise ValidationError("`top_k` must be strictly positive")
        if max_new_tokens is not None and max_new_tokens <= 0:
            raise ValidationError("`max_new_tokens` must be strictly positive")
        if len(stop) > lim.max_stop_sequences:
            raise ValidationError(
                f"`stop` supports up to {lim.max_stop_sequences} stop sequences. Given: {len(stop)}"
            )
        if any(s == "" for s in stop):
            raise ValidationError("`stop` sequences must not be empty strings")
        longest = max((len(s) for s in stop), default=0)
        if longest > MAX_STOP_SEQUENCE_CHARS:
            raise ValidationError(
                f"`stop` sequences must be at most {MAX_STOP_SEQUENCE_CHARS} characters long. "
                f"Given: {longest}"
            )
        if seed is not None and best_of > 1:
            raise ValidationError("`seed` must not be set when `best_of` > 1")
        if top_n_tokens is not None and not 0 <= top_n_tokens <= lim.max_top_n_tokens:
            raise ValidationError(
                f"`top_n_tokens` must be >= 0 and <= {lim.max_top_n_tokens}. Given: {top_n_tokens}"
            )
        if not inputs:
            raise ValidationError("`inputs` cannot be empty")
        if truncate is not None and not 0 < truncate <= lim.max_input_tokens:
            raise ValidationError(
                "`truncate` must be strictly positive and less than "
                f"{lim.max_input_tokens}. Given: {truncate}"
            )
        if watermark:
            raise ValidationError("`watermark` is not supported")
        if raw_params.get("grammar") is not None:
            raise ValidationError("grammar is not supported")
        adapter_id = self.adapters.adapter_id(adapter_id)  # 422 unless "" or a loaded adapter

        encoding = await self.tokenizer.encode(inputs, add_special_tokens=add_special_tokens)
        ids = encoding.ids
        if truncate is not None and len(ids) > truncate:
            ids = ids[-truncate:]  # keep the end of the prompt, next to what is generated
        input_length = len(ids)
        if input_length == 0:
            raise ValidationError("`inputs` cannot be empty")
        # TGI checks the total first; a too-long prompt is the root cause whenever it applies
        # (the default max_new_tokens even depends on it), so it is named first here.
        if input_length > lim.max_input_tokens:
            raise ValidationError(
                f"`inputs` must have less than {lim.max_input_tokens} tokens. Given: {input_length}"
            )
        if max_new_tokens is None:
            max_new_tokens = min(lim.max_total_tokens - input_length, DEFAULT_GENERATION_LENGTH)
        if input_length + max_new_tokens > lim.max_total_tokens:
            raise ValidationError(
                f"`inputs` tokens + `max_new_tokens` must be <= {lim.max_total_tokens}. "
                f"Given: {input_length} `inputs` tokens and {max_new_tokens} `max_new_tokens`"
            )

        top_k = top_k or 0
        top_p = 1.0 if top_p is None else top_p
        typical_p = 1.0 if typical_p is None else typical_p
        # TGI samples as soon as any warper is active, even with do_sample false.
        sample = do_sample or temperature != 1.0 or top_k != 0 or top_p < 1.0 or typical_p < 1.0
        sampling = SamplingParams(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            typical_p=typical_p,
            do_sample=sample,
            seed=random.getrandbits(64) if seed is None else seed,
            repetition_penalty=repetition_penalty,
            frequency_penalty=frequency_penalty,
        )
        return ValidRequest(
            inputs=inputs,
            input_ids=tuple(ids),
            sampling=sampling,
            max_new_tokens=max_new_tokens,
            stop=tuple(stop),
            details=details,
            decoder_input_details=decoder_input_details,
            return_full_text=return_full_text,
            top_n_tokens=top_n_tokens or 0,
            best_of=best_of,
            adapter_id=adapter_id,
        )
