"""OpenAI's request bodies: the fields /v1/completions and /v1/chat/completions share, the
completions body, and their mapping onto the shared GenerationRequest (chat: router/api/chat.py).

Unlike TGI, which ignores unknown fields, an unknown field is a 422 (the OpenAI API refuses them
too): a typo must not silently change what is generated. Features the shards cannot honour
(tools, suffix...) are a 422 saying so, never silently dropped, unless their
value changes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, PlainValidator, WithJsonSchema

from router.api.fields import (
    BODY,
    STOP_DESCRIPTION,
    STOP_SAYS,
    FrequencyPenalty,
    MaxNewTokens,
    ModelName,
    PresencePenalty,
    RepetitionPenalty,
    Seed,
    StopSequence,
    wire_int,
)
from router.api.grammar import Choices, ResponseFormat, StructuredOutputs, vllm_spec
from router.api.says import Says, Unsupported, field_error
from router.errors import ValidationError
from router.request import FieldNames, GenerationRequest
from router.structured import GrammarSpec

# OpenAI's default for /v1/completions (TGI would generate up to the context limit).
DEFAULT_MAX_TOKENS = 16
# OpenAI's bound on `n` (and `best_of`); --max-concurrent-requests bounds all of a request's
# sequences together (router/handlers/choices.py).
MAX_CHOICES = 128


def _as_list(stop: str | list[str]) -> list[str]:
    return [stop] if isinstance(stop, str) else stop


Ignored = Annotated[Any, Field(description="Accepted and ignored")]
# vLLM's top_k: -1 (its long-time default, which clients send) and 0 both mean every token.
VllmTopK = wire_int(
    32,
    ge=-1,
    description="Keep the k most likely tokens; -1 or 0: every token (vLLM)",
    below="must be -1 or 0 (every token), or positive",
)


# OpenAI's range for a logit bias; vLLM clamps to it, we refuse past it.
LOGIT_BIAS_LIMIT = 100.0
# Entries per request: each step pads every row to the largest (OpenAI documents no limit;
# banning or favouring a few hundred tokens is the use).
MAX_LOGIT_BIAS_TOKENS = 1024
# Digits of a token id key: vocabularies stay far below 10**10 tokens (and Python refuses to
# convert more than 4300 digits at all).
MAX_TOKEN_ID_DIGITS = 10


def _token_biases(value: dict[str, float]) -> tuple[tuple[int, float], ...]:
    """{"token id": bias} -> (id, bias) pairs, ids ascending (the vocabulary bound is the
    validator's: router/validation.py knows the model)."""
    if len(value) > MAX_LOGIT_BIAS_TOKENS:
        raise field_error(f" may bias at most {MAX_LOGIT_BIAS_TOKENS} tokens. Given: {len(value)}")
    pairs = {}
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit() and len(key) <= MAX_TOKEN_ID_DIGITS):
            shown = key if len(key) <= 32 else f"{key[:32]}..."
            raise field_error(
                f" keys must be token ids (decimal integers of at most {MAX_TOKEN_ID_DIGITS} "
                f"digits). Given: {shown!r}"
            )
        if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            raise field_error(f" values must be >= -100 and <= 100. Given: {bias} for token {key}")
        pairs[int(key)] = float(bias)  # "07" and "7" are one token: the last one given wins
    return tuple(sorted(pairs.items()))


LogitBias = Annotated[
    dict[str, float],
    AfterValidator(_token_biases),
    WithJsonSchema(
        {
            "type": "object",
            "description": "Token id -> bias added to its logit (OpenAI)",
            "propertyNames": {"pattern": f"^[0-9]{{1,{MAX_TOKEN_ID_DIGITS}}}$"},
            "additionalProperties": {
                "type": "number",
                "minimum": -LOGIT_BIAS_LIMIT,
                "maximum": LOGIT_BIAS_LIMIT,
            },
            "maxProperties": MAX_LOGIT_BIAS_TOKENS,
        }
    ),
]


class StreamOptions(BaseModel):
    model_config = BODY

    include_usage: bool = False
    include_obfuscation: Ignored = None


class OpenAIRequest(BaseModel):
    """What both routes accept. `ignore_eos`, `top_k`, `repetition_penalty` and `min_p` are
    vLLM's extensions."""

    model_config = BODY

    model: ModelName | None = None
    frequency_penalty: FrequencyPenalty | None = None
    presence_penalty: PresencePenalty | None = None
    logit_bias: LogitBias | None = None
    n: (
        Annotated[
            int,
            Field(ge=1, le=MAX_CHOICES, description="Choices per prompt, each sampled alone"),
            Says(f"must be >= 1 and <= {MAX_CHOICES}. Given: {{value}}"),
        ]
        | None
    ) = None
    seed: Seed | None = None
    stop: (
        Annotated[
            StopSequence | list[StopSequence],
            Field(description=STOP_DESCRIPTION),
            AfterValidator(_as_list),
            Says(kind="a string or a list of strings", rules=STOP_SAYS.rules),
        ]
        | None
    ) = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # OpenAI's range; 0 means greedy (exact argmax), whatever else is set.
    temperature: (
        Annotated[float, Field(ge=0.0, le=2.0), Says("must be >= 0.0 and <= 2.0. Given: {value}")]
        | None
    ) = None
    # 1.0 is OpenAI's "off" (TGI refuses it).
    top_p: (
        Annotated[float, Field(gt=0.0, le=1.0), Says("must be > 0.0 and <= 1.0. Given: {value}")]
        | None
    ) = None
    max_tokens: MaxNewTokens | None = None
    ignore_eos: bool = False
    top_k: VllmTopK | None = None
    repetition_penalty: RepetitionPenalty | None = None
    # vLLM's; 0 (what clients following e.g. Qwen3's recommended settings send) is "off".
    min_p: (
        Annotated[
            float,
            Field(ge=0.0, le=1.0, description="Drop tokens below min_p x the top probability"),
            Says("must be >= 0.0 and <= 1.0. Given: {value}"),
        ]
        | None
    ) = None
    # Structured output (vLLM takes it on both routes; TGI's `type` + `value` spelling too).
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's older spelling of structured_outputs.
    guided_json: Annotated[dict[str, Any] | str, Field(description="A JSON schema")] | None = None
    guided_regex: str | None = None
    guided_choice: Choices | None = None
    user: Ignored = None
    metadata: Ignored = None
    store: Ignored = None
    service_tier: Ignored = None
    safety_identifier: Ignored = None
    prompt_cache_key: Ignored = None
    prompt_cache_retention: Ignored = None
    parallel_tool_calls: Ignored = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _grammar(self) -> GrammarSpec | None:
        """Structured output, however it was asked for (at most one way)."""
        specs = {
            "response_format": self.response_format and self.response_format.spec(),
            "structured_outputs": self.structured_outputs and self.structured_outputs.spec(),
        }
        guided = {"guided_json": self.guided_json, "guided_regex": self.guided_regex,
                  "guided_choice": self.guided_choice}  # fmt: skip
        for name, value in guided.items():
            if value is not None:
                specs[name] = vllm_spec(name, **{name.removeprefix("guided_"): value})
        named = [name for name, spec in specs.items() if spec is not None]
        if len(named) > 1:
            given = ", ".join(f"`{n}`" for n in named)
            raise ValidationError(f"one output constraint per request, not {given}")
        return specs[named[0]] if named else None

    def shared(self) -> dict[str, Any]:
        """The GenerationRequest fields both routes map the same way."""
        if self.stream_options is not None and not self.stream:
            raise ValidationError("`stream_options` is only allowed when `stream` is true")
        out: dict[str, Any] = {
            "adapter": self.model,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repetition_penalty": self.repetition_penalty,
            "seed": self.seed,
            "stop": tuple(self.stop or ()),
            "ignore_eos": self.ignore_eos,
            "logit_bias": self.logit_bias or (),
            "grammar": self._grammar(),
        }
        # OpenAI samples by default; temperature 0 is greedy, and the warpers do not apply.
        if self.temperature is None or self.temperature > 0.0:
            out["do_sample"] = True
            out["temperature"] = self.temperature
            out["top_p"] = self.top_p if self.top_p is not None and self.top_p < 1.0 else None
            out["top_k"] = self.top_k if self.top_k is not None and self.top_k > 0 else None
            out["min_p"] = self.min_p or None
        return out


# A prompt as text, or as the token ids a client tokenized itself (vLLM accepts both; evaluation
# harnesses such as lm-eval send ids).
PromptInput = str | tuple[int, ...]


def _token_prompt(ids: list[Any]) -> tuple[int, ...]:
    if not ids:
        raise field_error(" cannot hold an empty prompt")
    # bool is an int in Python; JSON's true is not a token id.
    if not all(type(i) is int and i >= 0 for i in ids):
        raise field_error(" token ids must be integers >= 0")
    return tuple(ids)


PROMPT_FORMS = " must be a string, a list of strings, a list of token ids or a list of such lists"


def _prompts(prompt: Any) -> list[PromptInput]:
    """One prompt or several (OpenAI's four forms: a string, strings, token ids, lists of
    them); each is generated for as if sent alone, its choices in the order given."""
    if isinstance(prompt, str):
        prompt = [prompt]
    elif isinstance(prompt, list) and prompt and all(type(i) is int for i in prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise field_error(PROMPT_FORMS)
    out: list[PromptInput] = []
    for one in prompt:
        if isinstance(one, str):
            if not one:
                raise field_error(" cannot hold an empty prompt")
            out.append(one)
        elif isinstance(one, list):
            out.append(_token_prompt(one))
        else:
            raise field_error(f"{PROMPT_FORMS}. Given an element of type {type(one).__name__}")
    return out


TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
Prompts = Annotated[
    list[PromptInput],
    PlainValidator(_prompts),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
                TOKEN_IDS,
                {"type": "array", "items": TOKEN_IDS, "minItems": 1},
            ],
            "description": "One prompt or several, as text or token ids; each gets `n` choices",
        }
    ),
]  # fmt: skip


class CompletionRequest(OpenAIRequest):
    prompt: Prompts
    logprobs: (
        Annotated[
            int,
            Field(ge=0, description="Alternatives listed per token; <= --max-top-n-tokens"),
            Says("must be >= 0. Given: {value}"),
        ]
        | None
    ) = None
    best_of: (
        Annotated[
            int,
            Field(ge=1, le=MAX_CHOICES, description="Candidates per prompt (n kept)"),
            Says(f"must be >= 1 and <= {MAX_CHOICES}. Given: {{value}}"),
        ]
        | None
    ) = None
    echo: bool | None = None
    suffix: Annotated[str, Unsupported("")] | None = None

    def candidates(self) -> int:
        """Sequences generated per prompt (`best_of`, else `n`)."""
        n = self.n or 1
        if self.best_of is None:
            return n
        if self.best_of < n:
            raise ValidationError(f"`best_of` must be >= `n`. Given: {self.best_of} and {n}")
        if self.stream and self.best_of != n:
            raise ValidationError("`best_of` != `n` is not supported when streaming")
        return self.best_of

    def to_requests(self) -> list[GenerationRequest]:
        """One request per prompt. `echo` with `logprobs` needs the prompt's logprobs too."""
        return [
            GenerationRequest(
                inputs=prompt if isinstance(prompt, str) else "",
                input_ids=None if isinstance(prompt, str) else prompt,
                names=FieldNames("prompt", "max_tokens", "logprobs", adapter="model"),
                max_new_tokens=self.max_tokens or DEFAULT_MAX_TOKENS,
                top_n_tokens=self.logprobs or None,
                decoder_input_details=bool(self.echo) and self.logprobs is not None,
                best_of=self.best_of,  # --max-best-of bounds it, as on /generate
                **self.shared(),
            )
            for prompt in self.prompt
        ]
