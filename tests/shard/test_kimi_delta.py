"""Kimi Delta Attention's sequence mixing (shard/layers/kimi_delta.py) against transformers' own
torch functions (`chunk_kimi_delta_attention`, `recurrent_kimi_delta_attention`, Kimi Linear's),
on random inputs, on the CPU.

- prefill of a ragged batch from fresh slots and from non-zero states, and a prompt in chunks,
  each equal per sequence to transformers' (outputs and final states), with decays that differ
  per key channel from hardly any to forgetting within a few tokens;
- decode steps after a prefill, in float32 and bfloat16;
- the decay really is per channel: a state whose channels decay alike would not match;
- decode reads nothing on the host (it runs inside captured CUDA graphs);
- the pairwise decays, built a few blocks at a time, are the same built all at once.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.kimi_linear.modeling_kimi_linear import (
    chunk_kimi_delta_attention,
    recurrent_kimi_delta_attention,
)

from shard.layers import kimi_delta
from shard.layers.gated_delta import CHUNK_SIZE
from shard.layers.kimi_delta import kda_decode, kda_prefill
from tests.host_sync_guard import HostSyncGuard

# float32 against transformers' float32: the blocks sum in another order
TOL32 = dict(atol=1e-4, rtol=1e-4)
# Both sides in float32 from the same bfloat16 inputs, rounded once to bfloat16
BF16_ULP = dict(atol=1e-6, rtol=2**-7)

LENGTHS = [1, 3, CHUNK_SIZE, CHUNK_SIZE + 1, 150]
HEADS, DK, DV = 3, 16, 24
NAMES = ("q", "k", "v", "g", "beta")
Inputs = dict[str, torch.Tensor]


def _inputs(tokens: int, seed: int, dtype: torch.dtype = torch.float32) -> Inputs:
    """q, k, v, beta in `dtype`; g float32 as the model makes it, -A softplus(f + dt_bias) per
    channel, with A from 0.01 to 16 per channel: some channels forget within a token or two,
    others hardly at all."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    a = torch.empty(HEADS, DK).uniform_(0.01, 16, generator=gen)
    return dict(
        q=randn(tokens, HEADS, DK).to(dtype),
        k=randn(tokens, HEADS, DK).to(dtype),
        v=randn(tokens, HEADS, DV).to(dtype),
        g=-a * F.softplus(randn(tokens, HEADS, DK) - 4),
        beta=torch.rand(tokens, HEADS, generator=gen).to(dtype),
    )


def _rows(x: Inputs, rows: slice) -> Inputs:
    return {name: x[name][rows] for name in NAMES}


def _cat(*parts: Inputs) -> Inputs:
    return {name: torch.cat([p[name] for p in parts]) for name in NAMES}


def _spans(lengths: list[int]) -> list[slice]:
    starts = [sum(lengths[:b]) for b in range(len(lengths))]
    return [slice(s, s + n) for s, n in zip(starts, lengths, strict=True)]


def _reference(
    x: Inputs, initial: torch.Tensor | None = None, recurrent: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' KDA on one sequence (chunked, or token by token): ([T, H, Dv], [H, Dk, Dv])."""
    fn = recurrent_kimi_delta_attention if recurrent else chunk_kimi_delta_attention
    out, state = fn(
        *(x[name].unsqueeze(0) for name in NAMES),
        initial_state=None if initial is None else initial.unsqueeze(0),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    return out[0], state[0]


def _pool(size: int, fresh_slots: list[int], seed: int) -> torch.Tensor:
    """Random float32 states, NaN in the slots about to be started afresh."""
    pool = torch.randn(size, HEADS, DK, DV, generator=torch.Generator().manual_seed(seed))
    pool[fresh_slots] = float("nan")
    return pool


def _prefill(x: Inputs, pool, slots: list[int], lengths: list[int], fresh: list[bool]):
    return kda_prefill(*(x[n] for n in NAMES), pool, torch.tensor(slots), lengths, fresh)


def _others_untouched(after: torch.Tensor, before: torch.Tensor, used: list[int]) -> None:
    others = [s for s in range(before.shape[0]) if s not in used]
    torch.testing.assert_close(after[others], before[others], atol=0, rtol=0, equal_nan=True)


def test_prefill_of_a_ragged_batch_is_transformers_per_sequence():
    x = _inputs(sum(LENGTHS), seed=1)
    slots = [5, 0, 7, 2, 3]
    pool = _pool(9, slots, seed=2)
    before = pool.clone()

    out = _prefill(x, pool, slots, LENGTHS, [True] * len(LENGTHS))

    for span, slot in zip(_spans(LENGTHS), slots, strict=True):
        want_out, want_state = _reference(_rows(x, span))
        torch.testing.assert_close(out[span], want_out, **TOL32)
        torch.testing.assert_close(pool[slot], want_state, **TOL32)
    _others_untouched(pool, before, slots)


def test_prefill_from_a_state_is_transformers_with_initial_state():
    lengths = [CHUNK_SIZE + 7, 2]
    x = _inputs(sum(lengths), seed=3)
    pool = _pool(4, [], seed=4)
    before = pool.clone()
    slots = [3, 1]

    out = _prefill(x, pool, slots, lengths, [False, False])

    for span, slot in zip(_spans(lengths), slots, strict=True):
        want_out, want_state = _reference(_rows(x, span), before[slot], recurrent=True)
        torch.testing.assert_close(out[span], want_out, **TOL32)
        torch.testing.assert_close(pool[slot], want_state, **TOL32)
    _others_untouched(pool, before, slots)


def test_a_prompt_in_chunks_is_the_prompt_whole():
    """37 + 1 + 70 tokens (the last chunk crosses a block boundary), each chunk in a step beside
    another sequence: that one fresh, continued, then replaced by a fresh one in the same slot."""
    chunks = [37, 1, 70]
    x = _inputs(sum(chunks), seed=5)
    want_out, want_state = _reference(x)

    other = _inputs(60, seed=7)
    pool = _pool(6, [4, 1], seed=8)
    outs, other_state = [], None
    other_spans = _spans([10, 30, 20])
    for span, other_span, fresh in zip(
        _spans(chunks), other_spans, [True, False, True], strict=True
    ):
        theirs = _rows(other, other_span)
        lengths = [other_span.stop - other_span.start, span.stop - span.start]
        out = _prefill(
            _cat(theirs, _rows(x, span)), pool, [1, 4], lengths, [fresh, span.start == 0]
        )
        outs.append(out[lengths[0] :])
        want_theirs, other_state = _reference(theirs, None if fresh else other_state)
        torch.testing.assert_close(out[: lengths[0]], want_theirs, **TOL32)
        torch.testing.assert_close(pool[1], other_state, **TOL32)

    torch.testing.assert_close(torch.cat(outs), want_out, **TOL32)
    torch.testing.assert_close(pool[4], want_state, **TOL32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_steps_after_a_prefill_are_transformers_token_by_token(dtype):
    prompts, steps, slots = [5, CHUNK_SIZE, 1], 4, [6, 1, 3]
    seqs = [_inputs(n + steps, seed=10 + b, dtype=dtype) for b, n in enumerate(prompts)]
    pool = _pool(8, slots, seed=9)
    before = pool.clone()
    firsts = [_rows(s, slice(0, n)) for s, n in zip(seqs, prompts, strict=True)]
    _prefill(_cat(*firsts), pool, slots, prompts, [True] * 3)
    outs = []
    for step in range(steps):
        rows = [_rows(s, slice(n + step, n + step + 1)) for s, n in zip(seqs, prompts, strict=True)]
        x = _cat(*rows)
        outs.append(kda_decode(*(x[n] for n in NAMES), pool, torch.tensor(slots)))

    tol = TOL32 if dtype == torch.float32 else BF16_ULP
    for b, (seq, slot) in enumerate(zip(seqs, slots, strict=True)):
        want_out, want_state = _reference(seq, recurrent=True)
        got = torch.stack([o[b] for o in outs])
        assert got.dtype == dtype
        torch.testing.assert_close(got, want_out[-steps:], **tol)
        torch.testing.assert_close(pool[slot], want_state, **TOL32)
    _others_untouched(pool, before, slots)


def test_the_decay_is_per_channel():
    """The same inputs with each head's decays averaged over its channels give other outputs:
    the tests above would catch a decay taken per head."""
    x = _inputs(80, seed=30)
    per_head = {**x, "g": x["g"].mean(-1, keepdim=True).expand_as(x["g"]).contiguous()}
    out = _prefill(x, _pool(1, [0], seed=31), [0], [80], [True])
    other = _prefill(per_head, _pool(1, [0], seed=31), [0], [80], [True])
    assert (out - other).abs().max() > 0.1


def test_pairwise_decays_built_in_pieces_are_the_whole(monkeypatch):
    x = _inputs(sum(LENGTHS), seed=40)
    whole = _prefill(x, _pool(5, [], seed=41), [0, 1, 2, 3, 4], LENGTHS, [True] * 5)
    monkeypatch.setattr(kimi_delta, "PAIRWISE_ELEMENTS", 1)  # one block at a time
    pieces = _prefill(x, _pool(5, [], seed=41), [0, 1, 2, 3, 4], LENGTHS, [True] * 5)
    torch.testing.assert_close(pieces, whole, atol=0, rtol=0)


def test_decode_reads_nothing_on_the_host():
    x = _inputs(3, seed=50)
    pool, slots = _pool(4, [], seed=51), torch.tensor([2, 0, 3])
    with HostSyncGuard() as guard:
        kda_decode(*(x[n] for n in NAMES), pool, slots)
    assert guard.checked == 1


def test_decode_runs_on_the_meta_device():
    """Meta tensors have no values: any read of one on the host would raise."""
    x = {name: t.to("meta", torch.bfloat16) for name, t in _inputs(3, seed=52).items()}
    pool = torch.empty(4, HEADS, DK, DV, device="meta")
    out = kda_decode(*(x[n] for n in NAMES), pool, torch.tensor([2, 0, 3], device="meta"))
    assert out.shape == (3, HEADS, DV) and out.dtype == torch.bfloat16
