"""Whatever parameters the router lets through (router/api/fields.py, router/validation.py),
the sampler gives every row a real token and logprobs that are numbers: no NaN, nothing above
0, top-n sorted. Hypothesis explores the whole allowed ranges, the 32-bit extremes included
(penalties that are 0 or subnormal as float32, temperatures from 1e-5 to the float32 maximum,
top_k up to 2**32 - 1)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from router.api.fields import F32_MAX
from router.validation import GREEDY_BELOW_TEMPERATURE
from shard.sampling.params import SamplingParams
from shard.sampling.sampler import SamplingTensors, sample

VOCAB = 300
# The wire's widths of top_k and seed (router/api/fields.py: wire_int).
U32_MAX, U64_MAX = 2**32 - 1, 2**64 - 1
F32_TINY = 1.4e-45  # the smallest positive float32 (a subnormal)


def _positive_f32() -> st.SearchStrategy[float]:
    return st.one_of(
        st.sampled_from([1e-300, F32_TINY, 1e-38, 1e-30, 1e30, F32_MAX, 1.0]),
        st.floats(min_value=0.0, max_value=F32_MAX, exclude_min=True),
    )


def _unit_open() -> st.SearchStrategy[float]:
    return st.one_of(st.just(1.0), st.floats(min_value=1e-300, max_value=1.0, exclude_max=True))


rows = st.builds(
    SamplingParams,
    temperature=st.one_of(
        st.just(1.0),
        st.sampled_from([GREEDY_BELOW_TEMPERATURE, F32_MAX]),
        st.floats(min_value=GREEDY_BELOW_TEMPERATURE, max_value=F32_MAX),
    ),
    top_k=st.one_of(st.just(0), st.integers(min_value=1, max_value=U32_MAX)),
    top_p=_unit_open(),
    typical_p=_unit_open(),
    min_p=st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=1.0)),
    do_sample=st.booleans(),
    seed=st.integers(min_value=0, max_value=U64_MAX),
    repetition_penalty=_positive_f32(),
    frequency_penalty=st.floats(min_value=-2.0, max_value=2.0),
    presence_penalty=st.floats(min_value=-2.0, max_value=2.0),
    logit_bias=st.dictionaries(
        st.integers(min_value=0, max_value=VOCAB - 1), st.floats(min_value=-100.0, max_value=100.0)
    ).map(lambda biases: tuple(sorted(biases.items()))),
)


@settings(max_examples=150, deadline=None, database=None)
@given(
    params=st.lists(rows, min_size=1, max_size=4),
    scale=st.sampled_from([0.1, 3.0, 1e3]),
    data_seed=st.integers(min_value=0, max_value=2**31),
    top_n=st.integers(min_value=0, max_value=5),
)
def test_every_allowed_parameter_gives_a_token_and_real_logprobs(params, scale, data_seed, top_n):
    g = torch.Generator().manual_seed(data_seed)
    batch = len(params)
    logits = torch.randn(batch, VOCAB, generator=g) * scale
    history = torch.randint(0, VOCAB, (batch, 12), generator=g)
    lens = torch.randint(1, 13, (batch,), generator=g)
    prompt_lens = torch.randint(0, 13, (batch,), generator=g).minimum(lens).tolist()
    tensors = SamplingTensors.from_params(params, prompt_lens, "cpu")
    out = sample(logits, tensors, history, lens, top_n)
    assert ((out.next_ids >= 0) & (out.next_ids < VOCAB)).all()
    assert not torch.isnan(out.logprobs).any() and (out.logprobs <= 1e-5).all()
    assert not torch.isnan(out.top_logprobs).any() and (out.top_logprobs <= 1e-5).all()
    assert (out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all()
    assert ((out.top_ids >= 0) & (out.top_ids < VOCAB)).all()
