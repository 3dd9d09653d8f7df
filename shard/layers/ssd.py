"""The selective state-space scan of Mamba 2 (its "state space duality" form) for packed,
continuously batched steps: transformers' `mamba2_chunk_scan` and
`mamba2_selective_state_update` between the mixer's conv and its gated norm.

Per head h each sequence keeps a state S [N, P] (N the state size, P the head dim), decayed by
exp(dt A_h) and written with B (x dt)^T at every token, read by C:

    S <- exp(dt_t A_h) S + B_t (dt_t x_t)^T        y_t = C_t S + D_h x_t

B and C are shared by the heads of a group. That is linear attention with a scalar decay per
head and token (keys B, values dt x, queries C), so a prompt runs in blocks of `CHUNK_SIZE` tokens
as Gated DeltaNet's does (shard/layers/gated_delta.py) without its triangular solve: within a
block the outputs are a causal, decay-weighted C B^T times the values plus the starting state's
reading, and the state after the block one matmul more.

States live in per-layer pools `states` [S, H, N, P] (float32), a slot per sequence; a prompt
chunk starts from zeros where its sequence is `fresh`, else from its slot (chunked prefill).
Everything runs in float32 (transformers' chunked form does; its one-token form rounds dt B x to
the model's dtype, which float32 models do not see) and the output stays float32 for the gated
norm, as transformers hands it on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shard.layers.recurrent_steps import BlockLayout, starting_states, to_blocks

# Tokens per block of the chunked scan (any size gives the same values; 64 keeps the
# block-by-block matrices small on the CPU)
CHUNK_SIZE = 64


def time_steps(dt: torch.Tensor, dt_bias: torch.Tensor, limit: tuple[float, float]) -> torch.Tensor:
    """The per-token step of each head, float32 [T, H]: softplus(dt + dt_bias), clamped to the
    config's time_step_limit."""
    step = F.softplus(dt.float() + dt_bias.float())
    low, high = limit
    if low > 0.0 or high != float("inf"):
        step = step.clamp(min=low, max=high)
    return step


def _per_head(bc: torch.Tensor, heads: int) -> torch.Tensor:
    """B or C [T, G, N] -> float32 [T, H, N]: group g serves H/G consecutive heads (expand and
    reshape, so that the device reports no output size)."""
    tokens, groups, size = bc.shape
    per_group = heads // groups
    expanded = bc.float().unsqueeze(2).expand(tokens, groups, per_group, size)
    return expanded.reshape(tokens, heads, size)


def ssd_prefill(
    x: torch.Tensor,
    dt: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    neg_a: torch.Tensor,
    d: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
    lengths: list[int],
    fresh: list[bool],
) -> torch.Tensor:
    """Packed chunks of prompts: x [T, H, P], dt [T, H] (time_steps'), b, c [T, G, N], neg_a =
    -exp(A_log) and d [H] -> y [T, H, P] float32. Sequence b (lengths[b] tokens) starts from
    zeros if fresh[b], else from states[slots[b]], where its state after the chunk is written."""
    tokens, heads, head_dim = x.shape
    if not lengths:
        return x.new_empty(0, heads, head_dim, dtype=torch.float32)
    layout = BlockLayout.build(lengths, CHUNK_SIZE)
    gather = torch.tensor(layout.gather, device=x.device)
    values = x.float() * dt.unsqueeze(-1)
    log_decay = to_blocks(dt * neg_a.float(), gather, CHUNK_SIZE)  # [N, H, C]
    q = to_blocks(_per_head(c, heads), gather, CHUNK_SIZE)  # [N, H, C, N_state]
    k = to_blocks(_per_head(b, heads), gather, CHUNK_SIZE)
    v = to_blocks(values, gather, CHUNK_SIZE)  # [N, H, C, P]

    size = CHUNK_SIZE
    log_gamma = log_decay.cumsum(dim=-1)  # decay from the block's start through each token
    causal = torch.ones(size, size, dtype=torch.bool, device=x.device).tril()
    # gamma_i / gamma_j for j <= i as a difference of logs, masked to -inf above the diagonal
    # before exp (there the difference is positive and exp could overflow into inf * 0)
    gap = (log_gamma.unsqueeze(-1) - log_gamma.unsqueeze(-2)).masked_fill(~causal, float("-inf"))
    attn = (q @ k.transpose(-1, -2)) * gap.exp()
    q_read = q * log_gamma.exp().unsqueeze(-1)
    last = log_gamma[..., -1:]
    k_rest = k * (last - log_gamma).exp().unsqueeze(-1)
    decay = last.exp().unsqueeze(-1)

    order = torch.tensor(layout.order, device=x.device)
    seq_slots = slots.index_select(0, order)
    state = starting_states(states, seq_slots, [fresh[i] for i in layout.order]).float()
    out = attn @ v  # the block's own tokens; the starting states' part is added per step
    first = 0
    for count in layout.active:
        blocks = slice(first, first + count)
        start = state[:count]
        out[blocks] += q_read[blocks] @ start
        state[:count] = start * decay[blocks] + k_rest[blocks].transpose(-1, -2) @ v[blocks]
        first += count
    states.index_copy_(0, seq_slots, state.to(states.dtype))
    y = out.transpose(1, 2).reshape(-1, heads, head_dim)
    y = y.index_select(0, torch.tensor(layout.token_pos, device=x.device))
    return y + d.float().unsqueeze(-1) * x.float()


def ssd_decode(
    x: torch.Tensor,
    dt: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    neg_a: torch.Tensor,
    d: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One token per sequence: x [B, H, P], dt [B, H], b, c [B, G, N] -> y [B, H, P] float32;
    states[slots] advanced by one token in place. Fixed shapes, no host reads (CUDA graphs)."""
    heads = x.shape[1]
    values = x.float() * dt.unsqueeze(-1)  # [B, H, P]
    keys, queries = _per_head(b, heads), _per_head(c, heads)  # [B, H, N]
    decay = (dt * neg_a.float()).exp()[..., None, None]
    state = states.index_select(0, slots).float() * decay + keys.unsqueeze(-1) * values.unsqueeze(
        -2
    )
    states.index_copy_(0, slots, state.to(states.dtype))
    y = torch.einsum("bhnp,bhn->bhp", state, queries)
    return y + d.float().unsqueeze(-1) * x.float()
