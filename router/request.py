"""A generation request as every API hands it over (`GenerationRequest`: typed, checked field by
field, not yet against the server's limits), and as the validator resolves it (`ValidRequest`:
tokenized, defaults and seed resolved, ready to queue)."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.structured import CompiledGrammar, GrammarSpec
from shard.sampling.params import SamplingParams  # the one declaration, shared with the shard


@dataclass(frozen=True)
class FieldNames:
    """How the caller spelled the fields that the server's limits name in their errors."""

    inputs: str = "inputs"
    max_new_tokens: str = "max_new_tokens"
    top_n_tokens: str = "top_n_tokens"
    # TGI's `adapter_id` (unknown: 422) or OpenAI's `model` (unknown: 404, as OpenAI answers).
    adapter: str = "adapter_id"


@dataclass(frozen=True)
class GenerationRequest:
    inputs: str  # the prompt's text, unless given as `input_ids`
    names: FieldNames = FieldNames()
    input_ids: tuple[int, ...] | None = None  # a prompt the client tokenized (OpenAI completions)
    add_special_tokens: bool = True
    max_new_tokens: int | None = None  # None: up to the context limit
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    min_p: float | None = None  # vLLM's
    do_sample: bool = False
    seed: int | None = None  # None: a random one, reported back
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids ascending
    stop: tuple[str, ...] = ()
    truncate: int | None = None
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool = False
    top_n_tokens: int | None = None
    best_of: int | None = None
    adapter: str | None = None  # as named through `names.adapter`
    ignore_eos: bool = False
    grammar: GrammarSpec | None = None  # structured output (router/structured.py)


@dataclass(frozen=True)
class ValidRequest:
    inputs: str
    input_ids: tuple[int, ...]  # after truncation
    sampling: SamplingParams
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool = False
    top_n_tokens: int = 0
    best_of: int = 1
    adapter_id: str = ""
    # Structured output: the grammar every generated text must match, compiled.
    grammar: CompiledGrammar | None = field(default=None, compare=False)

    @property
    def input_length(self) -> int:
        return len(self.input_ids)

    @property
    def total_tokens(self) -> int:
        """Cache positions the request may occupy, all reserved at admission."""
        return len(self.input_ids) + self.max_new_tokens
