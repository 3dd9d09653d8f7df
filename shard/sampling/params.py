"""One request's sampling parameters: the one declaration the router fills in (after validating
them, once: router/validation.py) and the shard's sampler reads (shard/sampling/sampler.py
builds its batched tensors straight from these). Plain Python, no torch: the router imports it.

Neutral values: temperature 1.0, top_k 0, top_p 1.0, min_p 0.0, typical_p 1.0,
repetition_penalty 1.0, frequency_penalty 0.0, presence_penalty 0.0, logit_bias empty. On the wire
(NextTokenChooserParameters) an unset field reads 0; the shard's servicer turns those back into
the neutral values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    # vLLM's min_p: tokens less than min_p times as likely as the most likely one are dropped.
    min_p: float = 0.0
    # Already true when any warper is set (TGI samples whenever temperature != 1, top_k, top_p
    # or typical_p is given), so the shard only ever reads this flag: greedy rows ignore the
    # warper parameters.
    do_sample: bool = False
    seed: int = 0
    repetition_penalty: float = 1.0
    # OpenAI's additive penalties, over the generated ids only (as OpenAI defines them and
    # vLLM applies them); repetition_penalty covers the prompt too (HF, TGI, vLLM).
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # OpenAI's logit_bias: (token id, bias) pairs, ids ascending and distinct, added to the
    # logits before the penalties (as vLLM orders them).
    logit_bias: tuple[tuple[int, float], ...] = ()
