"""Mamba 1's selective scan (shard/layers/selective_scan.py) against transformers' own torch
forms: the scan over ragged prompt chunks that start fresh or continue from a slot, and the
one-token state update."""

from __future__ import annotations

import torch
from transformers.models.mamba.modeling_mamba import (
    mamba_selective_scan,
    mamba_selective_state_update,
)

from shard.layers.selective_scan import (
    BLOCK_SIZE,
    selective_scan_decode,
    selective_scan_prefill,
)
from tests.host_sync_guard import HostSyncGuard

CHANNELS, STATE = 6, 16
# float32 against transformers' float32 token-by-token scan: the blocks compose in another order
TOL32 = dict(atol=1e-5, rtol=1e-5)


def _params(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """-exp(A_log) as the releases initialise it (1 ... STATE per channel, scaled) and D."""
    g = torch.Generator().manual_seed(seed)
    a = torch.arange(1, STATE + 1, dtype=torch.float32).expand(CHANNELS, -1)
    return -a * torch.rand(CHANNELS, 1, generator=g), torch.randn(CHANNELS, generator=g)


def _inputs(tokens: int, seed: int) -> tuple[torch.Tensor, ...]:
    """x, the softplus'd steps (about 0.01 to 1: some channels remember the whole prompt), B, C."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, CHANNELS, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(tokens, CHANNELS, generator=g) * 2 - 3)
    b = torch.randn(tokens, STATE, generator=g)
    c = torch.randn(tokens, STATE, generator=g)
    return x, dt, b, c


def _reference(x, dt, b, c, neg_a, d):
    """transformers' scan of one sequence from zeros: y [T, D] and the last state [D, N]."""
    y, last = mamba_selective_scan(
        x.t()[None], dt.t()[None], neg_a, b.t()[None], c.t()[None], D=d, return_last_state=True
    )
    return y[0].t(), last[0]


def test_ragged_chunks_match_the_scan() -> None:
    """Three sequences across the block size in one step: a fresh one whose slot holds NaN from
    a previous owner (which must not leak), and two continuing from the states their first
    chunks left, which equal transformers' scan over their whole prompts."""
    neg_a, d = _params()
    heads = [0, 2 * BLOCK_SIZE + 7, BLOCK_SIZE]  # the continuing sequences' first chunks
    lengths, fresh = [3, 3 * BLOCK_SIZE + 1, 40], [True, False, False]
    whole = [_inputs(h + n, seed=i) for i, (h, n) in enumerate(zip(heads, lengths, strict=True))]
    states = torch.randn(5, CHANNELS, STATE)
    states[4] = float("nan")
    slots = torch.tensor([4, 0, 2])
    for seq in (1, 2):  # the first chunks, each alone
        first = [t[: heads[seq]] for t in whole[seq]]
        one = torch.tensor([slots[seq].item()])
        selective_scan_prefill(*first[:2], neg_a, *first[2:], d, states, one, [heads[seq]], [True])
    untouched = states[1].clone()
    chunks = [
        torch.cat([t[heads[s] :] for s, t in enumerate(parts)])
        for parts in zip(*whole, strict=True)
    ]
    x, dt, b, c = chunks
    y = selective_scan_prefill(x, dt, neg_a, b, c, d, states, slots, lengths, fresh)
    start = 0
    for seq, length in enumerate(lengths):
        ref_y, ref_state = _reference(*whole[seq], neg_a, d)
        torch.testing.assert_close(y[start : start + length], ref_y[heads[seq] :], **TOL32)
        torch.testing.assert_close(states[slots[seq]], ref_state, **TOL32)
        start += length
    assert torch.equal(states[1], untouched)  # slots of no sequence stay as they were


def test_decode_matches_the_state_update_and_reads_nothing_on_the_host() -> None:
    neg_a, d = _params(3)
    x, dt, b, c = _inputs(2, seed=4)
    states = torch.randn(3, CHANNELS, STATE)
    slots = torch.tensor([2, 0])
    ref_states = states[slots].clone()
    with HostSyncGuard():
        y = selective_scan_decode(x, dt, neg_a, b, c, d, states, slots)
    ref = mamba_selective_state_update(ref_states, x, dt, neg_a, b, c, d)
    torch.testing.assert_close(y, ref, **TOL32)
    torch.testing.assert_close(states[slots], ref_states, **TOL32)


def test_prefill_then_decode_equals_one_long_prefill() -> None:
    """A prompt's state carried into decoding gives the outputs a longer prompt would."""
    neg_a, d = _params(5)
    x, dt, b, c = _inputs(70, seed=6)
    whole, split, slot = (
        torch.zeros(1, CHANNELS, STATE),
        torch.zeros(1, CHANNELS, STATE),
        torch.tensor([0]),
    )
    y_all = selective_scan_prefill(x, dt, neg_a, b, c, d, whole, slot, [70], [True])
    selective_scan_prefill(x[:69], dt[:69], neg_a, b[:69], c[:69], d, split, slot, [69], [True])
    y_last = selective_scan_decode(x[69:], dt[69:], neg_a, b[69:], c[69:], d, split, slot)
    torch.testing.assert_close(y_last, y_all[69:], **TOL32)
    torch.testing.assert_close(split, whole, **TOL32)
