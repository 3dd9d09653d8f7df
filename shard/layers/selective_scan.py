"""The selective scan of Mamba 1 (transformers' `mamba_selective_scan` and
`mamba_selective_state_update`, the torch paths) for packed, continuously batched steps.

Every inner channel d keeps its own state h [N] (N the state size), decayed element by element
by exp(dt_t A_d) and written with dt_t x_t B_t at every token, read by C_t:

    h_t = exp(dt_t A_d) * h_{t-1} + dt_t x_t B_t        y_t = C_t . h_t + D_d x_t

Unlike Mamba 2's scalar decay per head (shard/layers/ssd.py), the decay differs per state
element, so there is no attention-like matrix form. A prompt instead runs in blocks of
`BLOCK_SIZE` tokens: within a block the per-token steps (a_t, b_t) = (exp(dt_t A), dt_t x_t B_t),
affine maps h -> a_t h + b_t, are composed by a log-depth inclusive scan (Hillis-Steele: only
products of decays <= 1, so nothing overflows), then applied to the state the block starts
from; blocks follow one another, all sequences' j-th blocks side by side (BlockLayout). Memory
is a block's [tokens, channels, N] per step, not the prompt's.

States live in per-layer pools `states` [S, D, N] (float32), a slot per sequence; a prompt chunk
starts from zeros where its sequence is `fresh`, else from its slot (chunked prefill).
Everything runs in float32, as transformers' scan does on float32 inputs (its half-precision
path rounds the state to the dtype before C reads it), and the output stays float32 for the gate.
"""

from __future__ import annotations

import torch

from shard.layers.recurrent_steps import BlockLayout, starting_states

# Tokens per block of the prompt scan: the scan takes log2(BLOCK_SIZE) steps a block, and a
# block's [tokens, channels, state] tensors bound the memory (any size gives the same values)
BLOCK_SIZE = 32


def _blocks(x: torch.Tensor, gather: torch.Tensor) -> torch.Tensor:
    """Packed tokens [T, ...] -> float32 blocks [num blocks, BLOCK_SIZE, ...] as a BlockLayout's
    `gather` lays them out (index T: a zero row past a sequence's end, whose step dt = 0 leaves
    the state as it is)."""
    x = torch.cat([x.float(), x.new_zeros(1, *x.shape[1:], dtype=torch.float32)])
    return x.index_select(0, gather).unflatten(0, (-1, BLOCK_SIZE))


def _compose(decay: torch.Tensor, write: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inclusive scan along dim 1 of the maps h -> decay_t h + write_t: (the product of the
    decays through t, the state at t from a zero start) [B, L, D, N]."""
    length, step = decay.shape[1], 1
    while step < length:
        write = torch.cat(
            [write[:, :step], decay[:, step:] * write[:, :-step] + write[:, step:]], 1
        )
        decay = torch.cat([decay[:, :step], decay[:, step:] * decay[:, :-step]], 1)
        step *= 2
    return decay, write


def selective_scan_prefill(
    x: torch.Tensor,
    dt: torch.Tensor,
    neg_a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
    lengths: list[int],
    fresh: list[bool],
) -> torch.Tensor:
    """Packed chunks of prompts: x [T, D] (the conv's output), dt [T, D] (float32 steps after
    their softplus), neg_a = -exp(A_log) [D, N], b, c [T, N], d [D] -> y [T, D] float32.
    Sequence b (lengths[b] tokens) starts from zeros if fresh[b], else from states[slots[b]],
    where its state after the chunk is written."""
    tokens, channels = x.shape
    if not lengths:
        return x.new_empty(0, channels, dtype=torch.float32)
    layout = BlockLayout.build(lengths, BLOCK_SIZE)
    gather = torch.tensor(layout.gather, device=x.device)
    step = _blocks(dt, gather)  # [num blocks, L, D]
    written = _blocks(x.float() * dt, gather)
    keys, queries = _blocks(b, gather), _blocks(c, gather)  # [num blocks, L, N]
    neg_a = neg_a.float()

    order = torch.tensor(layout.order, device=x.device)
    seq_slots = slots.index_select(0, order)
    state = starting_states(states, seq_slots, [fresh[i] for i in layout.order]).float()
    out = torch.empty(step.shape[:2] + (channels,), dtype=torch.float32, device=x.device)
    first = 0
    for count in layout.active:  # the sequences with a j-th block: the first `count` of order
        blocks = slice(first, first + count)
        decay = (step[blocks].unsqueeze(-1) * neg_a).exp()  # [count, L, D, N]
        write = written[blocks].unsqueeze(-1) * keys[blocks].unsqueeze(-2)
        decay, write = _compose(decay, write)
        h = decay * state[:count].unsqueeze(1) + write
        out[blocks] = torch.einsum("bldn,bln->bld", h, queries[blocks])
        state[:count] = h[:, -1]
        first += count
    states.index_copy_(0, seq_slots, state.to(states.dtype))
    y = out.flatten(0, 1).index_select(0, torch.tensor(layout.token_pos, device=x.device))
    return y + d.float() * x.float()


def selective_scan_decode(
    x: torch.Tensor,
    dt: torch.Tensor,
    neg_a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One token per sequence: x [B, D], dt [B, D] float32, b, c [B, N] -> y [B, D] float32;
    states[slots] advanced by one token in place. Fixed shapes, no host reads (CUDA graphs)."""
    decay = (dt.unsqueeze(-1) * neg_a.float()).exp()  # [B, D, N]
    write = (x.float() * dt).unsqueeze(-1) * b.float().unsqueeze(-2)
    h = states.index_select(0, slots).float() * decay + write
    states.index_copy_(0, slots, h.to(states.dtype))
    y = torch.einsum("bdn,bn->bd", h, c.float())
    return y + d.float() * x.float()
