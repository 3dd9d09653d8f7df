"""The server's limits on a GenerationRequest, checked once, whatever API it came through.

The APIs' bodies already checked every field's type and fixed range (router/api/); what is left
depends on this server: its flags (stop sequences, top-n tokens, best_of, prompt and total
lengths), its LoRA adapters, and the tokenizer. Errors are 422s that name the field as the
caller spelled it (`request.names`) and the limit, with TGI's messages. Defaults are resolved
here, including a random `seed` when none is given, so that every sampled result can be
reproduced from its reported seed.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from router.adapters import AdapterRegistry
from router.args import DEFAULT_MAX_GRAMMAR_SIZE, DEFAULT_MAX_STOP_SEQUENCE_LENGTH
from router.errors import ValidationError
from router.request import GenerationRequest, SamplingParams, ValidRequest
from router.structured import CompiledGrammar, Grammars
from router.tokenizer import Tokenizer

# TGI: without max_new_tokens, generate up to the context limit, at most this many tokens.
DEFAULT_GENERATION_LENGTH = 1024
# Below this temperature a request decodes greedily, as in vLLM: the tempered distribution is
# then all but the argmax's (unless two logits are within ~1e-4), and the shards' float32
# logits / temperature overflow to inf (NaN probabilities) for the smallest temperatures.
GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_TOP_N_TOKENS = 5
# What a grammar's size is measured on, by GrammarSpec.kind.
_GRAMMAR_TEXT = {"json": "JSON text", "regex": "a regex", "lark": "a grammar"}


@dataclass(frozen=True)
class ValidationLimits:
    max_input_tokens: int
    max_total_tokens: int
    max_stop_sequences: int = 4
    max_best_of: int = 2
    max_top_n_tokens: int = MAX_TOP_N_TOKENS
    vocab_size: int | None = None  # the model's logits; None: token ids are not checked
    max_stop_sequence_length: int = DEFAULT_MAX_STOP_SEQUENCE_LENGTH  # characters
    max_grammar_size: int = DEFAULT_MAX_GRAMMAR_SIZE  # bytes


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# A \\u escape of a UTF-16 surrogate (D800-DFFF): the only way a body can name one.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json_body(body: bytes) -> dict[str, Any]:
    """The request body as an object. Refused like any invalid JSON (a 422, as TGI's parser):
    NaN and Infinity, nesting deeper than the parser's recursion allows, and an unpaired UTF-16
    surrogate escape, which is not Unicode text and would fail the tokenizer later."""
    try:
        payload = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValidationError(f"request body is not valid JSON: {err}") from None
    except RecursionError:
        raise ValidationError("request body is not valid JSON: it is nested too deeply") from None
    if not isinstance(payload, dict):
        raise ValidationError("request body must be a JSON object")
    if SURROGATE_ESCAPE.search(body):  # rare: only then is the whole body checked
        _refuse_lone_surrogates(payload)
    return payload


def _refuse_lone_surrogates(payload: dict[str, Any]) -> None:
    try:
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        char = err.object[err.start]
        raise ValidationError(
            f"request body is not valid JSON text: it holds the unpaired UTF-16 surrogate "
            f"\\u{ord(char):04x}, which is not a Unicode character"
        ) from None


class Validator:
    def __init__(
        self,
        tokenizer: Tokenizer,
        limits: ValidationLimits,
        adapters: AdapterRegistry | None = None,
        grammars: Grammars | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.adapters = adapters or AdapterRegistry((), "")
        self.grammars = grammars  # None: structured output is refused

    async def validate(self, request: GenerationRequest) -> ValidRequest:
        lim, names = self.limits, request.names
        best_of = request.best_of
        if best_of is not None:
            if lim.max_best_of == 1 and best_of != 1:
                raise ValidationError("`best_of` != 1 is not allowed for this endpoint")
            if best_of == 0 or best_of > lim.max_best_of:
                raise ValidationError(
                    f"`best_of` must be > 0 and <= {lim.max_best_of}. Given: {best_of}"
                )
        stop = request.stop
        if len(stop) > lim.max_stop_sequences:
            raise ValidationError(
                f"`stop` supports up to {lim.max_stop_sequences} stop sequences. Given: {len(stop)}"
            )
        longest = max(map(len, stop), default=0)
        if longest > lim.max_stop_sequence_length:
            raise ValidationError(
                f"`stop` sequences must be at most {lim.max_stop_sequence_length} characters "
                f"long. Given: {longest}"
            )
        top_n = request.top_n_tokens
        if top_n is not None and not 0 <= top_n <= lim.max_top_n_tokens:
            raise ValidationError(
                f"`{names.top_n_tokens}` must be >= 0 and <= {lim.max_top_n_tokens}. Given: {top_n}"
            )
        truncate = request.truncate
        if truncate is not None and not 0 < truncate <= lim.max_input_tokens:
            raise ValidationError(
                "`truncate` must be strictly positive and less than "
                f"{lim.max_input_tokens}. Given: {truncate}"
            )
        self._check_logit_bias(request)
        adapter_id = self._adapter(request)
        ids = await self._input_ids(request)
        max_new_tokens = self._max_new_tokens(request, len(ids))
        grammar = await self._grammar(request)  # last: the one check that may take a while
        inputs = request.inputs
        if request.input_ids is not None:  # what echo and the timing headers report
            inputs = self.tokenizer.decode(ids)
        return ValidRequest(
            inputs=inputs,
            input_ids=tuple(ids),
            sampling=_sampling(request),
            max_new_tokens=max_new_tokens,
            stop=stop,
            ignore_eos=request.ignore_eos,
            details=request.details,
            decoder_input_details=request.decoder_input_details,
            return_full_text=request.return_full_text,
            top_n_tokens=top_n or 0,
            best_of=best_of or 1,
            adapter_id=adapter_id,
            grammar=grammar,
        )

    async def _grammar(self, request: GenerationRequest) -> CompiledGrammar | None:
        spec = request.grammar
        if spec is None:
            return None
        if self.grammars is None:
            raise ValidationError(f"`{spec.field}` is not supported by this server")
        size, limit = len(spec.value.encode()), self.limits.max_grammar_size
        if size > limit:  # compiling takes time and memory that grow with it
            raise ValidationError(
                f"`{spec.field}` must be at most {limit} bytes as {_GRAMMAR_TEXT[spec.kind]}. "
                f"Given: {size}"
            )
        # A large schema takes a while to build (llguidance releases the GIL meanwhile).
        return await asyncio.to_thread(self.grammars.compile, spec)

    def _check_logit_bias(self, request: GenerationRequest) -> None:
        vocab = self.limits.vocab_size
        outside = [i for i, _ in request.logit_bias if vocab is not None and i >= vocab]
        if outside:
            raise ValidationError(
                f"`logit_bias` names token id(s) {outside[:5]} outside the model's vocabulary "
                f"of {vocab} tokens"
            )

    def _adapter(self, request: GenerationRequest) -> str:
        if request.names.adapter == "model":  # OpenAI: the base model's name or an adapter's
            return self.adapters.model(request.adapter)
        return self.adapters.adapter_id(request.adapter or "")  # 422 unless "" or loaded

    async def _input_ids(self, request: GenerationRequest) -> list[int]:
        name, limit = request.names.inputs, self.limits.max_input_tokens
        vocab = self.limits.vocab_size
        if request.input_ids is not None:
            ids = list(request.input_ids)
            outside = [i for i in ids if vocab is not None and i >= vocab]
            if outside:
                raise ValidationError(
                    f"`{name}` holds token id(s) {outside[:5]} outside the model's vocabulary "
                    f"of {vocab} tokens"
                )
        else:
            encoding = await self.tokenizer.encode(
                request.inputs, add_special_tokens=request.add_special_tokens
            )
            ids = encoding.ids
            # A tokenizer may know more tokens than the model has embeddings (tokens added
            # after training): the shards would refuse the step.
            if vocab is not None and ids and max(ids) >= vocab:
                outside = sorted({i for i in ids if i >= vocab})[:5]
                raise ValidationError(
                    f"`{name}` tokenizes to token id(s) {outside} that the tokenizer knows but the "
                    f"model's vocabulary of {vocab} tokens does not"
                )
        if request.truncate is not None and len(ids) > request.truncate:
            ids = ids[-request.truncate :]  # keep the end of the prompt, next to what is generated
        if not ids:
            raise ValidationError(f"`{name}` cannot be empty")
        # TGI checks the total first; a too-long prompt is the root cause whenever it applies
        # (the default max_new_tokens even depends on it), so it is named first here.
        if len(ids) > limit:
            raise ValidationError(f"`{name}` must have less than {limit} tokens. Given: {len(ids)}")
        return ids

    def _max_new_tokens(self, request: GenerationRequest, input_length: int) -> int:
        names, total = request.names, self.limits.max_total_tokens
        max_new_tokens = request.max_new_tokens
        if max_new_tokens is None:
            max_new_tokens = min(total - input_length, DEFAULT_GENERATION_LENGTH)
        if input_length + max_new_tokens > total:
            inputs, new = names.inputs, names.max_new_tokens
            raise ValidationError(
                f"`{inputs}` tokens + `{new}` must be <= {total}. "
                f"Given: {input_length} `{inputs}` tokens and {max_new_tokens} `{new}`"
            )
        return max_new_tokens


def _sampling(request: GenerationRequest) -> SamplingParams:
    def given(value: Any, default: Any) -> Any:
        return default if value is None else value

    temperature = given(request.temperature, 1.0)
    top_k = given(request.top_k, 0)
    top_p = given(request.top_p, 1.0)
    typical_p = given(request.typical_p, 1.0)
    min_p = given(request.min_p, 0.0)
    # TGI samples as soon as any warper is active, even with do_sample false.
    sample = request.do_sample or temperature != 1.0 or top_k != 0 or top_p < 1.0 or typical_p < 1.0
    sample = sample or min_p > 0.0
    if temperature < GREEDY_BELOW_TEMPERATURE:  # the warpers then keep the argmax alone
        sample, temperature, top_k, top_p, typical_p, min_p = False, 1.0, 0, 1.0, 1.0, 0.0
    return SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        typical_p=typical_p,
        min_p=min_p,
        do_sample=sample,
        seed=random.getrandbits(64) if request.seed is None else request.seed,
        repetition_penalty=given(request.repetition_penalty, 1.0),
        frequency_penalty=given(request.frequency_penalty, 0.0),
        presence_penalty=given(request.presence_penalty, 0.0),
        logit_bias=request.logit_bias,
    )
