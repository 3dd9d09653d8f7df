"""shard.sampling.token_masks: structured output's per-step token masks, as the sampler applies
them, against masking by hand with the allowed sets (tests/shard/test_structured_output.py
checks the layout against llguidance's own masks, end to end)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shard.sampling.params import SamplingParams
from shard.sampling.sampler import SamplingTensors, sample
from shard.sampling.token_masks import apply_token_masks, gather_token_masks

VOCAB = 1000


def _packed(allowed: list[int], vocab: int = VOCAB) -> bytes:
    """The wire's layout: bit i % 32 of little-endian uint32 word i / 32."""
    words = np.zeros((vocab + 31) // 32, dtype="<u4")
    for token in allowed:
        words[token // 32] |= np.uint32(1 << (token % 32))
    return words.tobytes()


def _logits(batch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, VOCAB, generator=g) * 4


def _allowed_sets(seed: int, batch: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed + 1)
    sizes = [1, 2, 31, 32, 33, 500]
    return [
        torch.randperm(VOCAB, generator=g)[: sizes[i % len(sizes)]].tolist() for i in range(batch)
    ]


PARAMS = {
    "greedy": SamplingParams(),
    "sampled": SamplingParams(do_sample=True, seed=3),
    "top_k": SamplingParams(do_sample=True, top_k=40, temperature=0.7, seed=4),
    "top_p": SamplingParams(do_sample=True, top_p=0.9, seed=5),
    "typical": SamplingParams(do_sample=True, typical_p=0.8, seed=6),
    "penalized": SamplingParams(repetition_penalty=1.5, logit_bias=((7, 30.0),)),
}


@pytest.mark.parametrize("seed", range(4))
def test_constrained_rows_sample_inside_their_masks_and_the_others_are_untouched(seed):
    names = list(PARAMS)
    params = [PARAMS[n] for n in names] * 2  # each kind constrained once, unconstrained once
    batch = len(params)
    logits = _logits(batch, seed)
    sets = _allowed_sets(seed, batch)
    constrained = [i < len(names) for i in range(batch)]
    masks = {i: _packed(sets[i]) for i in range(batch) if constrained[i]}
    tensors = SamplingTensors.from_params(params, [1] * batch, "cpu")
    history = torch.zeros((batch, 2), dtype=torch.int64)
    lens = torch.full((batch,), 2, dtype=torch.int64)
    token_masks = gather_token_masks(list(range(batch)), constrained, masks, torch.device("cpu"))
    out = sample(logits, tensors, history, lens, 3, token_masks)
    free = sample(logits, tensors, history, lens, 3)

    for i in range(batch):
        if constrained[i]:
            assert out.next_ids[i].item() in sets[i], names[i]
            if not params[i].do_sample:  # the masked distribution, masked by hand
                reference = torch.full_like(logits[i : i + 1], float("-inf"))
                penalized = _penalized(logits[i : i + 1], params[i])
                reference[0, sets[i]] = penalized[0, sets[i]]
                assert out.next_ids[i].item() == reference.argmax().item()
                lp = torch.log_softmax(reference, -1)[0]
                assert out.logprobs[i].item() == pytest.approx(lp[out.next_ids[i]].item(), abs=1e-5)
            top = out.top_ids[i][out.top_logprobs[i] > float("-inf")].tolist()
            assert set(top) <= set(sets[i])
        else:
            assert out.next_ids[i] == free.next_ids[i]
            assert out.logprobs[i] == free.logprobs[i]


def _penalized(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The bias and repetition penalty of PARAMS["penalized"] on a row whose history is token
    0 (the test's history), as the sampler applies them before the mask."""
    row = row.clone()
    for token, bias in p.logit_bias:
        row[0, token] += bias
    if p.repetition_penalty != 1.0:
        v = row[0, 0]
        row[0, 0] = v * p.repetition_penalty if v < 0 else v / p.repetition_penalty
    return row


def test_a_single_allowed_token_is_forced_whatever_the_logits():
    logits = _logits(3, 9)
    params = [PARAMS["greedy"], PARAMS["sampled"], PARAMS["top_k"]]
    tensors = SamplingTensors.from_params(params, [1] * 3, "cpu")
    masks = {10 + i: _packed([999 - i]) for i in range(3)}
    token_masks = gather_token_masks([10, 11, 12], [True] * 3, masks, torch.device("cpu"))
    out = sample(
        logits, tensors, torch.zeros((3, 1), dtype=torch.int64), torch.ones(3), 0, token_masks
    )
    assert out.next_ids.tolist() == [999, 998, 997]
    assert torch.allclose(out.logprobs, torch.zeros(3))


def test_a_mask_shorter_than_the_logits_forbids_the_tokens_past_it():
    scores = torch.zeros(1, 100)
    scores[0, 80] = 50.0  # the favourite lies past the 64 tokens the mask covers
    masks = gather_token_masks([1], [True], {1: _packed([3], vocab=64)}, torch.device("cpu"))
    assert apply_token_masks(scores, masks, owned=False).argmax().item() == 3
    assert scores[0, 80] == 50.0  # not owned: the caller's tensor is left as it was


def test_a_constrained_row_without_a_usable_mask_fails_the_step():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="request 5 is constrained but the step carries no"):
        gather_token_masks([4, 5], [False, True], {4: _packed([1])}, cpu)
    with pytest.raises(ValueError, match="request 5: its token mask must be whole uint32 words"):
        gather_token_masks([5], [True], {5: bytes(8)}, cpu)  # allows nothing
    with pytest.raises(ValueError, match="whole uint32 words"):
        gather_token_masks([5], [True], {5: b"\xff" * 3}, cpu)
    assert gather_token_masks([4], [False], {}, cpu) is None
