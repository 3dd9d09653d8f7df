"""What speculative decoding does, from vLLM's `--speculative-config` JSON or TGI's `--speculate N`.

Two of vLLM's methods are implemented: "ngram" (prompt lookup: router/speculation/ngram.py) and
"draft_model" (a smaller model with the same vocabulary that the shards load beside the model:
shard/draft.py; `model` names it, a local directory or GGUF file the launcher resolves as it
resolves --model-id, and a `model` other than "ngram" without a method means this method, as
in vLLM). The keys keep vLLM's names, defaults and checks, so a vLLM command line works
unchanged: prompt_lookup_min and prompt_lookup_max (ngram only) default to 5 when neither is
given and to each other when one is, both are at least 1 and min <= max, num_speculative_tokens
is required and positive, and disable_by_batch_size is at least 2. One default is ours: without
disable_by_batch_size, speculation stops at DEFAULT_DISABLE_BY_BATCH_SIZE decoding requests
(vLLM never stops; JSON null asks for that here). Measured on the demo model on a CPU
(docs/benchmarks.md), a batch of 16 lost up to 16% of its output rate to verifying proposals;
below 8 it gains. Every other method,
and any key this router would ignore, is refused: a setting silently dropped would make a
benchmark measure something else than asked.

`--speculate N` is TGI's shorthand, here exactly `{"method": "ngram", "num_speculative_tokens": N}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SPECULATE_FLAG = "--speculate"
CONFIG_FLAG = "--speculative-config"
SUPPORTED_METHODS = ("ngram", "draft_model")
# vLLM's spelling of the method by its former `model` value.
NGRAM_ALIASES = ("ngram", "[ngram]")
# vLLM's other methods: named in the refusal so that it says "not implemented", not "unknown".
OTHER_VLLM_METHODS = (
    "eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "suffix", "ngram_gpu", "deepseek_mtp",
)  # fmt: skip
KEYS = (
    "method",
    "model",  # the draft model; "ngram" or "[ngram]": vLLM's older way to say that method
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "disable_by_batch_size",
)
# Proposed tokens per request and step. Each is one more position the verifying step computes
# for its row (a decode row becomes a 1 + k token prefill-like row), one more KV slot written
# and, for structured output, one more vocabulary-sized mask on the wire; prompt lookup rarely
# gets more than a few in a row accepted, so a larger k mostly buys wasted compute. The cap also
# bounds the widest step the shards must plan for.
MAX_SPECULATIVE_TOKENS = 16
# vLLM's default n-gram window when neither bound is given ("arbitrarily chosen" there).
DEFAULT_PROMPT_LOOKUP = 5
# Each generated token adds one n-gram per window size to the request's lookup tables (keyed
# by the n tokens), so memory and per-token work grow with the window; past a few dozen tokens a
# match is a verbatim copy that a shorter window finds as well.
MAX_PROMPT_LOOKUP = 64
# Ours (vLLM's is never): see the module's docstring.
DEFAULT_DISABLE_BY_BATCH_SIZE = 8


class SpeculativeConfigError(ValueError):
    """A speculative-decoding setting that cannot be served; the message names the key."""


PROMPT_LOOKUP_KEYS = ("prompt_lookup_min", "prompt_lookup_max")


@dataclass(frozen=True)
class SpeculativeConfig:
    num_speculative_tokens: int
    method: str = "ngram"
    prompt_lookup_min: int = DEFAULT_PROMPT_LOOKUP
    prompt_lookup_max: int = DEFAULT_PROMPT_LOOKUP
    # No proposals in a step whose decoding requests are at least this many (None: always
    # propose): a large batch is compute-bound, and verifying k extra positions per row costs
    # real time there instead of riding along a memory-bound step for free.
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE
    # draft_model: the draft's path as given (the launcher resolves it for the shards).
    model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in SUPPORTED_METHODS:
            raise SpeculativeConfigError(_method_refusal(self.method))
        if self.method == "draft_model" and not (isinstance(self.model, str) and self.model):
            raise SpeculativeConfigError(
                "method 'draft_model' needs model: the draft model's directory or GGUF file"
            )
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        _check_int("prompt_lookup_min", self.prompt_lookup_min, 1, MAX_PROMPT_LOOKUP)
        _check_int("prompt_lookup_max", self.prompt_lookup_max, 1, MAX_PROMPT_LOOKUP)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise SpeculativeConfigError(
                f"prompt_lookup_min={self.prompt_lookup_min} must be <= "
                f"prompt_lookup_max={self.prompt_lookup_max}"
            )
        if self.disable_by_batch_size is not None:
            # vLLM's bound: 1 would disable speculation for every step.
            _check_int("disable_by_batch_size", self.disable_by_batch_size, 2, None)

    def to_json(self) -> str:
        """The --speculative-config value that reads back as this config (the launcher forwards
        it to the router in this form)."""
        fields: dict[str, Any] = {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
        }
        if self.method == "draft_model":
            fields["model"] = self.model
        else:
            fields["prompt_lookup_min"] = self.prompt_lookup_min
            fields["prompt_lookup_max"] = self.prompt_lookup_max
        fields["disable_by_batch_size"] = self.disable_by_batch_size  # null: never
        return json.dumps(fields, separators=(",", ":"))


def speculate(num_tokens: int) -> SpeculativeConfig:
    """TGI's `--speculate N`."""
    return SpeculativeConfig(num_speculative_tokens=num_tokens)


def parse_speculative_config(text: str) -> SpeculativeConfig:
    """vLLM's `--speculative-config` JSON object."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise SpeculativeConfigError(f"not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise SpeculativeConfigError(f"must be a JSON object, got {type(raw).__name__}")
    unknown = [key for key in raw if key not in KEYS]
    if unknown:
        raise SpeculativeConfigError(
            f"key {unknown[0]!r} is not supported (supported keys: {', '.join(KEYS)})"
        )
    method = raw.get("method")
    model = raw.get("model")
    if model is not None and not (isinstance(model, str) and model):
        raise SpeculativeConfigError(f"model must be a non-empty string, got {model!r}")
    if method is None:
        if model is None:
            raise SpeculativeConfigError(
                f"method is required (supported: {', '.join(SUPPORTED_METHODS)})"
            )
        # vLLM's reading: "ngram" names the method, any other model a draft model.
        method = "ngram" if model in NGRAM_ALIASES else "draft_model"
    if method in NGRAM_ALIASES:
        method = "ngram"
    if method not in SUPPORTED_METHODS:
        raise SpeculativeConfigError(_method_refusal(method))
    if method == "ngram" and model is not None and model not in NGRAM_ALIASES:
        raise SpeculativeConfigError(
            f"model {model!r} cannot be used with method 'ngram' (a draft model is method "
            "'draft_model')"
        )
    if "num_speculative_tokens" not in raw:
        raise SpeculativeConfigError(f"num_speculative_tokens is required for method {method!r}")
    if method == "draft_model":
        given = [key for key in PROMPT_LOOKUP_KEYS if key in raw]
        if given:
            raise SpeculativeConfigError(f"{given[0]} is only for method 'ngram'")
        return SpeculativeConfig(
            method=method,
            model=model,
            num_speculative_tokens=raw["num_speculative_tokens"],
            disable_by_batch_size=raw.get("disable_by_batch_size", DEFAULT_DISABLE_BY_BATCH_SIZE),
        )
    low, high = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
    if low is None and high is None:
        low = high = DEFAULT_PROMPT_LOOKUP
    elif low is None:
        low = high
    elif high is None:
        high = low
    return SpeculativeConfig(
        method=method,
        num_speculative_tokens=raw["num_speculative_tokens"],
        prompt_lookup_min=low,
        prompt_lookup_max=high,
        disable_by_batch_size=raw.get("disable_by_batch_size", DEFAULT_DISABLE_BY_BATCH_SIZE),
    )


def _method_refusal(method: object) -> str:
    known = "is not implemented" if method in OTHER_VLLM_METHODS else "is not a known method"
    return f"method {method!r} {known} (supported: {', '.join(SUPPORTED_METHODS)})"


def _check_int(key: str, value: object, low: int, high: int | None) -> None:
    # JSON's true is an int to Python; a float or a string is a typo worth naming.
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpeculativeConfigError(f"{key} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise SpeculativeConfigError(f"{key} must be {bound}, got {value}")
