"""Sequence mixing of Gated DeltaNet, the linear-attention layers of Qwen3.5 and Qwen3-Next, for
packed, continuously batched steps (transformers' `Qwen3_5GatedDeltaNet` between its input
projections and its gated norm).

A sequence's whole past lives in two fixed-size states, one slot per sequence in per-layer pools:

- `conv_states` [S, C, K-1] (model dtype): the last K-1 inputs of the depthwise causal conv over
  the C = 2*Hk*Dk + Hv*Dv channels of q, k and v.
- `states` [S, Hv, Dk, Dv] (float32): the recurrent state, read as o = S^T q and updated per token
  by the gated delta rule: S <- exp(g) S + k (beta (v - (exp(g) S)^T k))^T.

Tokens of all sequences of a step are packed along dim 0; sequence b owns `slots[b]`.

- `gated_delta_prefill` (after shard/layers/causal_conv.py's conv): ragged chunks of prompts
  (`lengths` and `fresh` on the host); a sequence starts from zeros where `fresh`, else from its
  slot (chunked prefill). The delta rule runs in blocks of `CHUNK_SIZE` tokens (the UT-transform
  form of transformers' `torch_chunk_gated_delta_rule`), so a long prompt costs a few matmuls per
  block rather than a Python step per token.
- `gated_delta_decode`: one token per sequence, vectorised over the
  batch, with fixed shapes and no read of device values on the host: they run inside CUDA graphs.

Rounding follows transformers: the delta rule in float32 (q and k L2-normalised there, q scaled by
Dk**-0.5) and the output rounded to q's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shard.layers.recurrent_steps import BlockLayout, starting_states, to_blocks

# Tokens per block of the chunked delta rule, as transformers and FLA.
CHUNK_SIZE = 64
# transformers' l2norm (and FLA's) adds eps to the sum of squares, not to the norm.
L2NORM_EPS = 1e-6


# --- gated delta rule ------------------------------------------------------------------------


def float_heads(
    q: torch.Tensor, k: torch.Tensor, value_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [N, Hk, Dk] -> float32 [N, Hv, Dk], L2-normalised, q also scaled by Dk**-0.5; each
    key head serves Hv // Hk consecutive value heads. Expand + reshape rather than
    repeat_interleave: the same layout, with no output size for the device to report."""

    def prepare(x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        x = x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)
        n, heads, dim = x.shape
        group = value_heads // heads
        return x.unsqueeze(2).expand(n, heads, group, dim).reshape(n, value_heads, dim)

    q, k = prepare(q), prepare(k)
    return q * q.shape[-1] ** -0.5, k


@dataclass(frozen=True)
class BlockTerms:
    """Per block, what the scan needs beside the state S0 the block starts from (UT transform):
    with gamma_i the decay from the block's start through token i, the rule's corrections are
    delta = u - w S0, the outputs o = q_read S0 + attn delta, and the state after the block
    decay S0 + k_rest^T delta. Kimi Delta Attention (shard/layers/kimi_delta.py) builds the same
    terms with a decay per key channel, and scans them here too."""

    u: torch.Tensor  # [N, H, C, Dv]
    w: torch.Tensor  # [N, H, C, Dk]
    q_read: torch.Tensor  # [N, H, C, Dk]: gamma_i q_i
    attn: torch.Tensor  # [N, H, C, C]: causal (q_i . k_j) gamma_i / gamma_j
    k_rest: torch.Tensor  # [N, H, C, Dk]: k_j gamma_last / gamma_j
    decay: torch.Tensor  # [N, H, 1, 1]: gamma_last ([N, H, Dk, 1] decaying per key channel)


def _block_terms(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> BlockTerms:
    """q, k [N, H, C, Dk], v [N, H, C, Dv], g, beta [N, H, C], float32 (padding all zeros: no
    decay, no write, no read).

    Unrolling the rule inside a block, token i's correction delta_i = beta_i (v_i - S_{i-1}'s
    decayed prediction for k_i) depends on S0 and on the earlier corrections of the block:
    (I + A) delta = beta v - (beta gamma k) S0, A_ij = beta_i (k_i . k_j) gamma_i / gamma_j for
    j < i. One unit lower triangular solve gives u and w for all tokens at once."""
    size = g.shape[-1]
    log_gamma = g.cumsum(dim=-1)
    causal = torch.ones(size, size, dtype=torch.bool, device=g.device).tril()
    # gamma_i / gamma_j for j <= i, computed as a difference of logs; masked to -inf above the
    # diagonal before exp, where the difference is positive and exp could overflow (inf * 0)
    log_gap = log_gamma.unsqueeze(-1) - log_gamma.unsqueeze(-2)
    gap = log_gap.masked_fill(~causal, float("-inf")).exp()
    gamma = log_gamma.exp().unsqueeze(-1)
    k_beta = k * beta.unsqueeze(-1)
    strictly_lower = ((k_beta @ k.transpose(-1, -2)) * gap).tril(-1)
    rhs = torch.cat([v * beta.unsqueeze(-1), k_beta * gamma], dim=-1)
    solved = torch.linalg.solve_triangular(strictly_lower, rhs, upper=False, unitriangular=True)
    u, w = solved.split([v.shape[-1], k.shape[-1]], dim=-1)
    last = log_gamma[..., -1:]
    return BlockTerms(
        u=u,
        w=w,
        q_read=q * gamma,
        attn=(q @ k.transpose(-1, -2)) * gap,
        k_rest=k * (last - log_gamma).exp().unsqueeze(-1),
        decay=last.exp().unsqueeze(-1),
    )


def scan_blocks(terms: BlockTerms, state: torch.Tensor, active: list[int]) -> torch.Tensor:
    """Carries `state` [B, H, Dk, Dv] (in the layout's order, updated in place) through the
    blocks step by step; returns the outputs [N, H, C, Dv]."""
    out = torch.empty_like(terms.u)
    first = 0
    for count in active:
        blocks = slice(first, first + count)
        start = state[:count]
        delta = terms.u[blocks] - terms.w[blocks] @ start
        out[blocks] = terms.q_read[blocks] @ start + terms.attn[blocks] @ delta
        state[:count] = start * terms.decay[blocks] + terms.k_rest[blocks].transpose(-1, -2) @ delta
        first += count
    return out


def gated_delta_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
    lengths: list[int],
    fresh: list[bool],
) -> torch.Tensor:
    """Packed chunks of prompts: q, k [T, Hk, Dk], v [T, Hv, Dv], g, beta [T, Hv] -> o
    [T, Hv, Dv] in q's dtype. Sequence b (lengths[b] tokens) starts from zeros if fresh[b], else
    from states[slots[b]], where its state after the chunk is written."""
    return scan_prefill(q, k, v, g, beta, states, slots, lengths, fresh, _block_terms)


def scan_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
    lengths: list[int],
    fresh: list[bool],
    block_terms: Callable[..., BlockTerms],
) -> torch.Tensor:
    """The delta rule over packed prompt chunks in blocks, whatever the decay's shape (a
    scalar per head here, a vector per head in shard/layers/kimi_delta.py): `block_terms`
    makes each block's terms from its float32 q, k, v, g and beta."""
    out_dtype = q.dtype
    tokens, value_heads, value_dim = v.shape
    if not lengths:
        return v.new_empty(0, value_heads, value_dim, dtype=out_dtype)
    layout = BlockLayout.build(lengths, CHUNK_SIZE)
    gather = torch.tensor(layout.gather, device=v.device)

    def blocks(x: torch.Tensor) -> torch.Tensor:
        return to_blocks(x, gather, CHUNK_SIZE)

    q, k = float_heads(q, k, value_heads)
    terms = block_terms(blocks(q), blocks(k), blocks(v), blocks(g), blocks(beta))
    order = torch.tensor(layout.order, device=v.device)
    seq_slots = slots.index_select(0, order)
    state = starting_states(states, seq_slots, [fresh[b] for b in layout.order]).float()
    out = scan_blocks(terms, state, layout.active)
    states.index_copy_(0, seq_slots, state.to(states.dtype))
    out = out.transpose(1, 2).reshape(-1, value_heads, value_dim)
    return out.index_select(0, torch.tensor(layout.token_pos, device=v.device)).to(out_dtype)


def gated_delta_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One token per sequence: q, k [B, Hk, Dk], v [B, Hv, Dv], g, beta [B, Hv] -> o [B, Hv, Dv]
    in q's dtype; states[slots] advanced by one token in place. Fixed shapes, no host reads.
    g may also be [B, Hv, Dk], a decay per key channel (Kimi Delta Attention's)."""
    out_dtype = q.dtype
    q, k = float_heads(q, k, v.shape[1])
    v, beta = v.float(), beta.float()
    decay = g.float().exp().reshape(*g.shape[:2], -1, 1)  # [B, Hv, 1 or Dk, 1]
    state = states.index_select(0, slots).float() * decay  # [B, Hv, Dk, Dv]
    predicted = torch.einsum("bhkv,bhk->bhv", state, k)
    delta = (v - predicted) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    states.index_copy_(0, slots, state.to(states.dtype))
    return torch.einsum("bhkv,bhk->bhv", state, q).to(out_dtype)
