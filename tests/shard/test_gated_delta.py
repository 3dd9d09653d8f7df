"""Gated DeltaNet's sequence mixing (shard/layers/gated_delta.py) against transformers' own
Qwen3.5 functions, on random inputs, on the CPU.

- the delta rule: ragged prefills from fresh slots, prefills from a non-zero state, prompts in
  several chunks and runs of decode steps, each equal per sequence to transformers'
  `torch_recurrent_gated_delta_rule` (token by token), outputs and final states;
- the causal conv: prefill equal to `causal_conv1d_fn`, decode to `causal_conv1d_update`, a
  prompt in chunks to the prompt whole, in float32 and bfloat16;
- the slots: only the batch's slots change, and a fresh sequence ignores what its slot held
  (NaN here, so that reading it would show in the results);
- the decode functions read nothing on the host (`HostSyncGuard`, and the meta device, which
  has no values to read): they run inside captured CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    causal_conv1d_fn,
    causal_conv1d_update,
    torch_recurrent_gated_delta_rule,
)

from shard.layers.causal_conv import causal_conv1d_decode, causal_conv1d_prefill
from shard.layers.gated_delta import CHUNK_SIZE, gated_delta_decode, gated_delta_prefill
from tests.host_sync_guard import HostSyncError, HostSyncGuard

# float32 against the token-by-token reference: the blocks sum in another order (measured: under
# 2e-6 for outputs and states of magnitude ~1)
TOL32 = dict(atol=1e-4, rtol=1e-4)
# Both sides in float32 then rounded once to bfloat16: one unit in the last place (8 significant
# bits) where the float32 values straddle a rounding boundary.
BF16_ULP = dict(atol=1e-6, rtol=2**-7)
# The conv: float32 convolutions of different lengths may sum in another order (measured:
# 2.4e-7); in bfloat16 one unit in the last place for the same reason (measured: equal).
CONV_TOL = {torch.float32: dict(atol=1e-6, rtol=1e-6), torch.bfloat16: BF16_ULP}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]

# A ragged batch: one token, fewer than a block, a block, a block and one, several blocks.
LENGTHS = [1, 3, CHUNK_SIZE, CHUNK_SIZE + 1, 150]
# Qwen3-Next's shapes in small: value heads grouped on key heads, or as many; Dk != Dv.
HEADS = [pytest.param(2, 4, id="Hk2-Hv4"), pytest.param(3, 3, id="Hk3-Hv3")]
DK, DV = 16, 24
CHANNELS, KERNEL = 24, 4


def _spans(lengths: list[int]) -> list[slice]:
    starts = [sum(lengths[:b]) for b in range(len(lengths))]
    return [slice(s, s + n) for s, n in zip(starts, lengths, strict=True)]


def _assert_others_untouched(after: torch.Tensor, before: torch.Tensor, used: list[int]) -> None:
    others = [s for s in range(before.shape[0]) if s not in used]
    assert others  # the pools below always have spare slots
    torch.testing.assert_close(after[others], before[others], atol=0, rtol=0, equal_nan=True)


# --- the delta rule: helpers -----------------------------------------------------------------

Inputs = dict[str, torch.Tensor]  # q, k, v, g, beta: one row per token
NAMES = ("q", "k", "v", "g", "beta")


def _delta_inputs(
    tokens: int, hk: int, hv: int, seed: int, dtype: torch.dtype = torch.float32
) -> Inputs:
    """q, k, v, beta in `dtype`; g in float32 as the model makes it, -A softplus(a + dt_bias)
    with A up to 16: some heads forget within a few tokens, others hardly at all."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    a = torch.empty(hv).uniform_(0.01, 16, generator=gen)
    return dict(
        q=randn(tokens, hk, DK).to(dtype),
        k=randn(tokens, hk, DK).to(dtype),
        v=randn(tokens, hv, DV).to(dtype),
        g=-a * F.softplus(randn(tokens, hv) - 4),
        beta=torch.rand(tokens, hv, generator=gen).to(dtype),
    )


def _rows(x: Inputs, rows: slice) -> Inputs:
    return {name: x[name][rows] for name in NAMES}


def _cat(*parts: Inputs) -> Inputs:
    return {name: torch.cat([p[name] for p in parts]) for name in NAMES}


def _reference(x: Inputs, initial: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' token-by-token rule on one sequence: ([T, Hv, Dv], [Hv, Dk, Dv])."""
    out, state = torch_recurrent_gated_delta_rule(
        *(x[name].unsqueeze(0) for name in NAMES),
        initial_state=None if initial is None else initial.unsqueeze(0),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    return out[0], state[0]


def _prefill(x: Inputs, pool, slots: list[int], lengths: list[int], fresh: list[bool]):
    args = [x[name] for name in NAMES]
    return gated_delta_prefill(*args, pool, torch.tensor(slots), lengths, fresh)


def _decode(x: Inputs, pool, slots: list[int]):
    return gated_delta_decode(*(x[name] for name in NAMES), pool, torch.tensor(slots))


def _state_pool(size: int, hv: int, fresh_slots: list[int], seed: int) -> torch.Tensor:
    """Random float32 states, NaN in the slots about to be started afresh."""
    pool = torch.randn(size, hv, DK, DV, generator=torch.Generator().manual_seed(seed))
    pool[fresh_slots] = float("nan")
    return pool


# --- the delta rule: prefill -----------------------------------------------------------------


@pytest.mark.parametrize(("hk", "hv"), HEADS)
def test_prefill_of_a_ragged_batch_is_the_recurrent_rule_per_sequence(hk, hv):
    x = _delta_inputs(sum(LENGTHS), hk, hv, seed=1)
    slots = [5, 0, 7, 2, 3]
    pool = _state_pool(9, hv, slots, seed=2)
    before = pool.clone()

    out = _prefill(x, pool, slots, LENGTHS, [True] * len(LENGTHS))

    assert out.shape == x["v"].shape and out.dtype == torch.float32
    for span, slot in zip(_spans(LENGTHS), slots, strict=True):
        want_out, want_state = _reference(_rows(x, span))
        torch.testing.assert_close(out[span], want_out, **TOL32)
        torch.testing.assert_close(pool[slot], want_state, **TOL32)
    _assert_others_untouched(pool, before, slots)


@pytest.mark.parametrize(("hk", "hv"), HEADS)
def test_prefill_from_a_state_is_transformers_with_initial_state(hk, hv):
    lengths = [CHUNK_SIZE + 7, 2]
    x = _delta_inputs(sum(lengths), hk, hv, seed=3)
    pool = _state_pool(4, hv, [], seed=4)
    before = pool.clone()
    slots = [3, 1]

    out = _prefill(x, pool, slots, lengths, [False, False])

    for span, slot in zip(_spans(lengths), slots, strict=True):
        want_out, want_state = _reference(_rows(x, span), before[slot])
        torch.testing.assert_close(out[span], want_out, **TOL32)
        torch.testing.assert_close(pool[slot], want_state, **TOL32)
    _assert_others_untouched(pool, before, slots)


@pytest.mark.parametrize(("hk", "hv"), HEADS)
def test_a_prompt_in_chunks_is_the_prompt_whole(hk, hv):
    """37 + 1 + 70 tokens (the last chunk crosses a block boundary), each chunk in a step with
    another sequence: that one fresh, continued, then replaced by a fresh one in the same slot."""
    chunks = [37, 1, 70]
    x = _delta_inputs(sum(chunks), hk, hv, seed=5)
    whole_pool = _state_pool(1, hv, [0], seed=6)
    whole = _prefill(x, whole_pool, [0], [sum(chunks)], [True])

    other = _delta_inputs(60, hk, hv, seed=7)
    other_spans = _spans([10, 30, 20])
    other_fresh = [True, False, True]
    pool = _state_pool(6, hv, [4, 1], seed=8)
    before = pool.clone()
    outs, other_state = [], None
    for span, other_span, fresh in zip(_spans(chunks), other_spans, other_fresh, strict=True):
        theirs = _rows(other, other_span)
        lengths = [other_span.stop - other_span.start, span.stop - span.start]
        out = _prefill(
            _cat(theirs, _rows(x, span)), pool, [1, 4], lengths, [fresh, span.start == 0]
        )
        outs.append(out[lengths[0] :])

        want_out, other_state = _reference(theirs, None if fresh else other_state)
        torch.testing.assert_close(out[: lengths[0]], want_out, **TOL32)
        torch.testing.assert_close(pool[1], other_state, **TOL32)

    torch.testing.assert_close(torch.cat(outs), whole, **TOL32)
    torch.testing.assert_close(pool[4], whole_pool[0], **TOL32)
    _assert_others_untouched(pool, before, [1, 4])


# --- the delta rule: decode ------------------------------------------------------------------


def _prefill_then_decode(
    hk: int, hv: int, dtype: torch.dtype, seed: int
) -> tuple[list[Inputs], list[torch.Tensor], torch.Tensor, torch.Tensor, list[int]]:
    """Three prompts prefilled into slots 6, 1, 3 of 8, then four decode steps: the sequences,
    each one's decode outputs stacked, the pool after, the pool before, the slots."""
    prompts, steps, slots = [5, CHUNK_SIZE, 1], 4, [6, 1, 3]
    seqs = [_delta_inputs(n + steps, hk, hv, seed + b, dtype) for b, n in enumerate(prompts)]
    pool = _state_pool(8, hv, slots, seed=seed - 1)
    before = pool.clone()
    _prefill(
        _cat(*(_rows(s, slice(0, n)) for s, n in zip(seqs, prompts, strict=True))),
        pool,
        slots,
        prompts,
        [True] * len(prompts),
    )
    outs = []
    for step in range(steps):
        rows = [_rows(s, slice(n + step, n + step + 1)) for s, n in zip(seqs, prompts, strict=True)]
        outs.append(_decode(_cat(*rows), pool, slots))
    decoded = [torch.stack([o[b] for o in outs]) for b in range(len(seqs))]
    return seqs, decoded, pool, before, slots


@pytest.mark.parametrize(("hk", "hv"), HEADS)
def test_decode_steps_after_a_prefill_follow_the_recurrent_rule(hk, hv):
    seqs, decoded, pool, before, slots = _prefill_then_decode(hk, hv, torch.float32, seed=10)

    for seq, got, slot in zip(seqs, decoded, slots, strict=True):
        want_out, want_state = _reference(seq)
        torch.testing.assert_close(got, want_out[-len(got) :], **TOL32)
        torch.testing.assert_close(pool[slot], want_state, **TOL32)
    _assert_others_untouched(pool, before, slots)


def test_bfloat16_inputs_are_computed_in_float32_and_rounded_once():
    """q, k, v and beta in bfloat16 as the model gives them: both sides compute in float32 from
    the same bfloat16 values, the outputs rounded to bfloat16, the states kept in float32."""
    seqs, decoded, pool, _, slots = _prefill_then_decode(2, 4, torch.bfloat16, seed=20)

    for seq, got, slot in zip(seqs, decoded, slots, strict=True):
        want_out, want_state = _reference(seq)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, want_out[-len(got) :], **BF16_ULP)
        torch.testing.assert_close(pool[slot], want_state, **TOL32)

    x = _delta_inputs(sum(LENGTHS), 2, 4, seed=21, dtype=torch.bfloat16)
    pool = _state_pool(5, 4, [], seed=22)
    out = _prefill(x, pool, [4, 3, 2, 1, 0], LENGTHS, [True] * len(LENGTHS))
    assert out.dtype == torch.bfloat16
    for span in _spans(LENGTHS):
        torch.testing.assert_close(out[span], _reference(_rows(x, span))[0], **BF16_ULP)


# --- the causal conv -------------------------------------------------------------------------


def _conv_inputs(tokens: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, C] and the conv's weight [C, K] (the checkpoint's [C, 1, K] squeezed)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, CHANNELS, generator=gen).to(dtype)
    return x, (0.5 * torch.randn(CHANNELS, KERNEL, generator=gen)).to(dtype)


def _conv_pool(size: int, dtype: torch.dtype, fresh_slots: list[int], seed: int) -> torch.Tensor:
    pool = torch.randn(size, CHANNELS, KERNEL - 1, generator=torch.Generator().manual_seed(seed))
    pool[fresh_slots] = float("nan")
    return pool.to(dtype)


def _conv_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """transformers' prefill conv of one fresh sequence, [L, C] -> [L, C]."""
    return causal_conv1d_fn(x.t().unsqueeze(0), weight, None, activation="silu")[0].t()


def _last_inputs(x: torch.Tensor) -> torch.Tensor:
    """A fresh sequence's last K-1 inputs, [C, K-1], zeros before its first."""
    return F.pad(x.t(), (KERNEL - 1, 0))[:, -(KERNEL - 1) :]


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_prefill_of_fresh_sequences_is_causal_conv1d_fn(dtype):
    lengths = [1, 2, KERNEL - 1, KERNEL, 40]
    x, weight = _conv_inputs(sum(lengths), dtype, seed=30)
    slots = [3, 1, 0, 7, 5]
    pool = _conv_pool(8, dtype, slots, seed=31)
    before = pool.clone()

    out = causal_conv1d_prefill(x, weight, pool, torch.tensor(slots), lengths, [True] * 5)

    assert out.shape == x.shape and out.dtype == dtype
    for span, slot in zip(_spans(lengths), slots, strict=True):
        torch.testing.assert_close(out[span], _conv_reference(x[span], weight), **CONV_TOL[dtype])
        torch.testing.assert_close(pool[slot], _last_inputs(x[span]), atol=0, rtol=0)
    _assert_others_untouched(pool, before, slots)


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_prompt_in_chunks_is_the_prompt_whole(dtype):
    """Chunks of 2, 1 and 9 tokens: the first two shorter than the K-1 inputs the state holds,
    so the state after them still holds inputs of earlier chunks (and zeros before the first)."""
    chunks = [2, 1, 9]
    x, weight = _conv_inputs(sum(chunks), dtype, seed=32)
    other, _ = _conv_inputs(3 * 5, dtype, seed=33)
    whole = _conv_reference(x, weight)
    pool = _conv_pool(4, dtype, [2, 0], seed=34)
    before = pool.clone()

    outs = []
    for step, (span, other_span) in enumerate(zip(_spans(chunks), _spans([5] * 3), strict=True)):
        batch = torch.cat([x[span], other[other_span]])
        lengths = [span.stop - span.start, 5]
        fresh = [step == 0, True]
        out = causal_conv1d_prefill(batch, weight, pool, torch.tensor([2, 0]), lengths, fresh)
        outs.append(out[: lengths[0]])
        tol = CONV_TOL[dtype]
        torch.testing.assert_close(
            out[lengths[0] :], _conv_reference(other[other_span], weight), **tol
        )
        torch.testing.assert_close(pool[2], _last_inputs(x[: span.stop]), atol=0, rtol=0)

    torch.testing.assert_close(torch.cat(outs), whole, **CONV_TOL[dtype])
    _assert_others_untouched(pool, before, [2, 0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_decode_after_a_prefill_is_causal_conv1d_update(dtype):
    prompts, steps, slots = [1, 6, KERNEL - 1], 3, [2, 5, 0]
    seqs = [_conv_inputs(n + steps, dtype, seed=40 + b)[0] for b, n in enumerate(prompts)]
    _, weight = _conv_inputs(1, dtype, seed=39)
    pool = _conv_pool(6, dtype, slots, seed=41)
    before = pool.clone()
    prompt_rows = torch.cat([s[:n] for s, n in zip(seqs, prompts, strict=True)])
    causal_conv1d_prefill(prompt_rows, weight, pool, torch.tensor(slots), prompts, [True] * 3)
    # transformers' per-sequence state, [1, C, K-1]: what a fresh prompt leaves
    ref_states = [_last_inputs(s[:n]).unsqueeze(0) for s, n in zip(seqs, prompts, strict=True)]

    for step in range(steps):
        rows = torch.stack([s[n + step] for s, n in zip(seqs, prompts, strict=True)])
        out = causal_conv1d_decode(rows, weight, pool, torch.tensor(slots))
        assert out.shape == rows.shape and out.dtype == dtype
        for b, state in enumerate(ref_states):
            want = causal_conv1d_update(rows[b][None, :, None], state, weight, None, "silu")
            torch.testing.assert_close(out[b], want[0, :, 0], **CONV_TOL[dtype])
            torch.testing.assert_close(pool[slots[b]], state[0], atol=0, rtol=0)
    _assert_others_untouched(pool, before, slots)


# --- decode reads nothing on the host ----------------------------------------------------------


def _decode_arguments(device: str) -> tuple[tuple, tuple]:
    """Arguments of both decode functions (two rows, bfloat16 model dtype), made before any guard:
    making them from host data is the step's upload, not the decode's concern."""
    rows, pool_size, hk, hv = 2, 5, 2, 4

    def make(*shape: int, dtype=torch.float32) -> torch.Tensor:
        return torch.randn(*shape).to(device=device, dtype=dtype)

    slots = torch.tensor([4, 1], device=device)
    bf16 = torch.bfloat16
    conv = (
        make(rows, CHANNELS, dtype=bf16),
        make(CHANNELS, KERNEL, dtype=bf16),
        make(pool_size, CHANNELS, KERNEL - 1, dtype=bf16),
        slots,
    )
    delta = (
        make(rows, hk, DK, dtype=bf16),
        make(rows, hk, DK, dtype=bf16),
        make(rows, hv, DV, dtype=bf16),
        -make(rows, hv).abs(),
        make(rows, hv, dtype=bf16).sigmoid(),
        make(pool_size, hv, DK, DV),
        slots,
    )
    return conv, delta


def test_decode_reads_nothing_on_the_host():
    conv, delta = _decode_arguments("cpu")
    with HostSyncGuard() as guard:
        causal_conv1d_decode(*conv)
        gated_delta_decode(*delta)
    assert guard.checked == 1


def test_the_host_guard_sees_what_prefill_reads():
    """The guard does see through these functions: prefill builds index tensors from its host
    lists (fine before a step, not inside a graph), and the guard fails on it."""
    x, weight = _conv_inputs(4, torch.float32, seed=50)
    pool, slots = _conv_pool(2, torch.float32, [], seed=51), torch.tensor([1])
    with pytest.raises(HostSyncError), HostSyncGuard():
        causal_conv1d_prefill(x, weight, pool, slots, [4], [False])


def test_decode_runs_on_the_meta_device():
    """Meta tensors have no values: any read of one on the host (item, tolist, a data-dependent
    shape) raises."""
    conv, delta = _decode_arguments("meta")
    conv_out = causal_conv1d_decode(*conv)
    delta_out = gated_delta_decode(*delta)
    assert conv_out.shape == conv[0].shape and conv_out.dtype == torch.bfloat16
    assert delta_out.shape == delta[2].shape and delta_out.dtype == torch.bfloat16
