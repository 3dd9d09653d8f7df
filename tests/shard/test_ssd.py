"""Mamba 2's scan (shard/layers/ssd.py) against transformers' own torch forms: the chunked scan
for ragged prompt chunks that start fresh or from a slot, and the one-token state update."""

from __future__ import annotations

import pytest
import torch
from transformers.models.granitemoehybrid.modeling_granitemoehybrid import (
    mamba2_chunk_scan,
    mamba2_selective_state_update,
)

from shard.layers.ssd import CHUNK_SIZE, ssd_decode, ssd_prefill, time_steps
from tests.host_sync_guard import HostSyncGuard

HEADS, GROUPS, HEAD_DIM, STATE = 4, 2, 8, 16
# float32 against transformers' float32 chunked scan: the blocks sum in another order
TOL32 = dict(atol=1e-4, rtol=1e-4)
NO_LIMIT = (0.0, float("inf"))


def _params(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a_log": torch.log(torch.arange(1, HEADS + 1, dtype=torch.float32)) * 0.5,
        "dt_bias": torch.randn(HEADS, generator=g) * 0.5,
        "d": torch.randn(HEADS, generator=g),
    }


def _inputs(tokens: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HEADS, HEAD_DIM, generator=g)
    dt = torch.randn(tokens, HEADS, generator=g)
    b = torch.randn(tokens, GROUPS, STATE, generator=g)
    c = torch.randn(tokens, GROUPS, STATE, generator=g)
    return x, dt, b, c


def _reference(x, dt, b, c, p, initial, limit=NO_LIMIT):
    """transformers' chunked scan of one sequence: y [T, H, P] and the state in our layout
    [H, N, P] (its own is [H, P, N])."""
    y, final = mamba2_chunk_scan(
        x[None], dt[None], -p["a_log"].exp(), b[None], c[None], chunk_size=CHUNK_SIZE,
        D=p["d"], dt_bias=p["dt_bias"], initial_states=initial.transpose(-1, -2)[None],
        dt_softplus=True, dt_limit=limit, return_final_states=True,
    )  # fmt: skip
    return y[0], final[0].transpose(-1, -2)


@pytest.mark.parametrize("limit", [NO_LIMIT, (0.05, 0.8)])
def test_ragged_chunks_match_the_chunked_scan(limit) -> None:
    """Three sequences of lengths across the block size in one step, one fresh (its slot holds
    NaN from a previous owner, which must not leak) and two continuing from their slots."""
    p = _params()
    lengths, fresh = [3, 150, 64], [True, False, False]
    x, dt, b, c = _inputs(sum(lengths), seed=1)
    states = torch.randn(5, HEADS, STATE, HEAD_DIM) * 0.3
    states[4] = float("nan")
    slots = torch.tensor([4, 0, 2])
    before = states.clone()
    step = time_steps(dt, p["dt_bias"], limit)
    y = ssd_prefill(x, step, b, c, -p["a_log"].exp(), p["d"], states, slots, lengths, fresh)
    start = 0
    for seq, length in enumerate(lengths):
        part = slice(start, start + length)
        initial = torch.zeros(HEADS, STATE, HEAD_DIM) if fresh[seq] else before[slots[seq]]
        ref_y, ref_state = _reference(x[part], dt[part], b[part], c[part], p, initial, limit)
        torch.testing.assert_close(y[part], ref_y, **TOL32)
        torch.testing.assert_close(states[slots[seq]], ref_state, **TOL32)
        start += length
    torch.testing.assert_close(states[1], before[1])  # slots of no sequence stay as they were


def test_decode_matches_the_state_update_and_reads_nothing_on_the_host() -> None:
    p = _params(3)
    x, dt, b, c = _inputs(2, seed=4)
    states = torch.randn(3, HEADS, STATE, HEAD_DIM)
    slots = torch.tensor([2, 0])
    ref_states = states[slots].transpose(-1, -2).clone()  # transformers' [B, H, P, N]
    step = time_steps(dt, p["dt_bias"], NO_LIMIT)
    with HostSyncGuard():
        y = ssd_decode(x, step, b, c, -p["a_log"].exp(), p["d"], states, slots)
    expand = (HEADS, HEAD_DIM)
    ref = mamba2_selective_state_update(
        ref_states, x, dt[..., None].expand(-1, *expand), -p["a_log"].exp()[:, None, None].expand(
            *expand, STATE), b, c, p["d"][:, None].expand(*expand), dt_bias=p["dt_bias"][
            :, None].expand(*expand), dt_softplus=True,
    )  # fmt: skip
    torch.testing.assert_close(y, ref, **TOL32)
    torch.testing.assert_close(states[slots], ref_states.transpose(-1, -2), **TOL32)


def test_prefill_then_decode_equals_one_long_prefill() -> None:
    """A prompt's state carried into decoding gives the outputs a longer prompt would."""
    p = _params(5)
    x, dt, b, c = _inputs(70, seed=6)
    step = time_steps(dt, p["dt_bias"], NO_LIMIT)
    neg_a = -p["a_log"].exp()
    whole = torch.zeros(1, HEADS, STATE, HEAD_DIM)
    y_all = ssd_prefill(x, step, b, c, neg_a, p["d"], whole, torch.tensor([0]), [70], [True])
    split = torch.zeros(1, HEADS, STATE, HEAD_DIM)
    slot = torch.tensor([0])
    ssd_prefill(x[:69], step[:69], b[:69], c[:69], neg_a, p["d"], split, slot, [69], [True])
    y_last = ssd_decode(x[69:], step[69:], b[69:], c[69:], neg_a, p["d"], split, slot)
    torch.testing.assert_close(y_last, y_all[69:], **TOL32)
    torch.testing.assert_close(split, whole, **TOL32)
