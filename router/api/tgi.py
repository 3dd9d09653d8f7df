"""TGI's request bodies (/generate, /generate_stream, /, /tokenize) and their mapping onto the
shared GenerationRequest. Field names, types and ranges are TGI's; see router/api/fields.py."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, Field

from router.api.fields import (
    BODY,
    AdapterName,
    FrequencyPenalty,
    MaxNewTokens,
    RepetitionPenalty,
    Seed,
    Stop,
    Temperature,
    TopK,
    TopP,
    TypicalP,
)
from router.api.grammar import TgiGrammar
from router.api.parsing import parse
from router.api.says import Says, Unsupported
from router.errors import ValidationError
from router.request import GenerationRequest


class GenerateParameters(BaseModel):
    """TGI's GenerateParameters. Known fields may be null, as TGI's clients send them all."""

    model_config = BODY
    # Unknown ones are named with their object, not to be taken for top-level fields.
    unknown_field_prefix: ClassVar[str] = "parameters."

    best_of: (
        Annotated[
            int,
            Field(ge=0, description="Samples to draw, the best returned; <= --max-best-of"),
            Says(rules={"greater_than_equal": "must be an integer >= 0, got {value}"}),
        ]
        | None
    ) = None
    temperature: Temperature | None = None
    repetition_penalty: RepetitionPenalty | None = None
    frequency_penalty: FrequencyPenalty | None = None
    top_k: TopK | None = None
    top_p: TopP | None = None
    typical_p: TypicalP | None = None
    do_sample: bool | None = None
    max_new_tokens: MaxNewTokens | None = None
    return_full_text: bool | None = None
    stop: Stop | None = None
    truncate: (
        Annotated[
            int, Field(description="Keep the last N prompt tokens; 0 < N <= --max-input-tokens")
        ]
        | None
    ) = None
    watermark: Annotated[bool, Unsupported(False)] | None = None
    details: bool | None = None
    decoder_input_details: bool | None = None
    seed: Seed | None = None
    top_n_tokens: (
        Annotated[int, Field(description="Alternatives per token; 0..--max-top-n-tokens")] | None
    ) = None
    grammar: TgiGrammar | None = None
    adapter_id: AdapterName | None = None


class TokenizeRequest(BaseModel):
    """TGI's /tokenize takes a generate request; its parameters do not change the tokens."""

    model_config = BODY

    inputs: str
    parameters: GenerateParameters | None = None
    add_special_tokens: bool = True


class GenerateRequest(TokenizeRequest):
    """TGI's GenerateRequest (with CompatGenerateRequest's `stream`, which must match the route)."""

    inputs: Annotated[str, Field(min_length=1), Says("cannot be empty")]
    stream: bool | None = None


def parse_generate(payload: dict[str, Any], *, stream: bool) -> GenerationRequest:
    """`stream`: whether the route streams."""
    return to_request(parse(GenerateRequest, payload), stream=stream)


def to_request(body: GenerateRequest, *, stream: bool) -> GenerationRequest:
    if body.stream is not None and body.stream != stream:
        raise ValidationError(
            "`stream` is true: streams come from /generate_stream (or from / with `stream`)"
            if not stream
            else "`stream` is false: single answers come from /generate"
        )
    p = body.parameters or GenerateParameters()
    best_of = p.best_of or 1
    if stream and best_of != 1:
        raise ValidationError("`best_of` != 1 is not supported when streaming tokens")
    if stream and p.decoder_input_details:
        raise ValidationError(
            "`decoder_input_details` == true is not supported when streaming tokens"
        )
    warpers = (p.temperature, p.top_k, p.top_p, p.typical_p)
    if best_of > 1 and not (p.do_sample or any(v is not None for v in warpers)):
        raise ValidationError("you must use sampling when `best_of` is > 1")
    if p.seed is not None and best_of > 1:
        raise ValidationError("`seed` must not be set when `best_of` > 1")
    return GenerationRequest(
        inputs=body.inputs,
        add_special_tokens=body.add_special_tokens,
        max_new_tokens=p.max_new_tokens,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        typical_p=p.typical_p,
        do_sample=bool(p.do_sample),
        seed=p.seed,
        repetition_penalty=p.repetition_penalty,
        frequency_penalty=p.frequency_penalty,
        stop=tuple(p.stop or ()),
        truncate=p.truncate,
        details=bool(p.details),
        decoder_input_details=bool(p.decoder_input_details),
        return_full_text=bool(p.return_full_text),
        top_n_tokens=p.top_n_tokens,
        best_of=p.best_of,
        adapter=p.adapter_id or "",
        grammar=p.grammar.spec("parameters.grammar") if p.grammar is not None else None,
    )
