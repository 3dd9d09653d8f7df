"""Sequence mixing of Gated DeltaNet, the linear-attention layers of Qwen3.5 and Qwen3-Next, for
packed, continuously batched steps (transformers' `Qwen3_5GatedDeltaNet` between its input
projections and its gated norm).

A sequence's whole past lives in two fixed-size states, one slot per sequence in per-layer pools:

- `conv_states` [S, C, K-1] (model dtype): the last K-1 inputs of the depthwise causal conv over
  the C = 2*Hk*Dk + Hv*Dv channels of q, k and v.
- `states` [S, Hv, Dk, Dv] (float32): the recurrent state, read as o = S^T q and updated per token
  by the gated delta rule: S <- exp(g) S + k (beta (v - (exp(g) S)^T k))^T.

Tokens of all sequences of a step are packed along dim 0; sequence b owns `slots[b]`.

- `causal_conv1d_prefill` / `gated_delta_prefill`: ragged chunks of prompts (`lengths` and
  `fresh` on the host); a sequence starts from zeros where `fresh`, else from its slot (chunked
  prefill). The delta rule runs in blocks of `CHUNK_SIZE` tokens (the UT-transform form of
  transformers' `torch_chunk_gated_delta_rule`), so a long prompt costs a few matmuls per block
  rather than a Python step per token.
- `causal_conv1d_decode` / `gated_delta_decode`: one token per sequence, vectorised over the
  batch, with fixed shapes and no read of device values on the host: they run inside CUDA graphs.

Rounding follows transformers: the conv in the weight's dtype (F.conv1d, then SiLU, then the
input's dtype); the delta rule in float32 (q and k L2-normalised there, q scaled by Dk**-0.5) and
the output rounded to q's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Tokens per block of the chunked delta rule, as transformers and FLA.
CHUNK_SIZE = 64
# transformers' l2norm (and FLA's) adds eps to the sum of squares, not to the norm.
L2NORM_EPS = 1e-6


# --- state slots -----------------------------------------------------------------------------


def _starting_states(pool: torch.Tensor, slots: torch.Tensor, fresh: list[bool]) -> torch.Tensor:
    """Each sequence's state from its slot, zeros for fresh ones: a fresh slot's content is
    whatever its previous owner left (NaN included), so it is overwritten, not multiplied away."""
    rows = pool.index_select(0, slots)
    if any(fresh):
        mask = torch.tensor(fresh, dtype=torch.bool, device=pool.device)
        rows = rows.masked_fill(mask.view(-1, *([1] * (rows.dim() - 1))), 0)
    return rows


# --- causal depthwise conv -------------------------------------------------------------------


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    slots: torch.Tensor,
    lengths: list[int],
    fresh: list[bool],
) -> torch.Tensor:
    """silu(causal depthwise conv) of packed chunks: x [T, C], weight [C, K] -> [T, C] in x's
    dtype; each sequence's last K-1 inputs (older ones from its state where its chunk is shorter)
    written to conv_states[slots[b]].

    All sequences go through one conv: each one's history columns followed by its tokens, laid
    end to end, so that every output whose window lies inside one sequence's stretch is that
    sequence's, and the outputs whose window straddles two stretches are dropped."""
    history = weight.shape[-1] - 1
    if not lengths:
        return x.new_empty(0, x.shape[1])
    prev = _starting_states(conv_states, slots, fresh).to(weight.dtype)  # [B, C, K-1]
    columns = x.t().to(weight.dtype)  # [C, T]
    pieces, token_cols, state_cols = [], [], []
    start = stretch = 0
    for b, length in enumerate(lengths):
        pieces += [prev[b], columns[:, start : start + length]]
        # output j ends at input column j + K-1: this sequence's tokens end at its stretch's
        # columns history .. history+length-1, so their outputs are at stretch .. stretch+length-1
        token_cols.extend(range(stretch, stretch + length))
        end = stretch + history + length
        state_cols.extend(range(end - history, end))
        start, stretch = start + length, end
    window = torch.cat(pieces, dim=1)  # [C, sum(K-1 + lengths)]
    new_states = window[:, torch.tensor(state_cols, device=x.device)]  # [C, B*(K-1)]
    new_states = new_states.view(x.shape[1], len(lengths), history).transpose(0, 1)
    conv_states.index_copy_(0, slots, new_states.to(conv_states.dtype))
    out = _depthwise_silu(window.unsqueeze(0), weight)[0]  # [C, outputs]
    return out[:, torch.tensor(token_cols, device=x.device)].t().to(x.dtype)


def causal_conv1d_decode(
    x: torch.Tensor, weight: torch.Tensor, conv_states: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """One token per sequence: x [B, C] -> silu(conv) [B, C] in x's dtype; conv_states[slots]
    shifted by one input. Fixed shapes, no host reads: safe to capture in a CUDA graph."""
    prev = conv_states.index_select(0, slots).to(weight.dtype)  # [B, C, K-1]
    window = torch.cat([prev, x.to(weight.dtype).unsqueeze(-1)], dim=-1)  # [B, C, K]
    conv_states.index_copy_(0, slots, window[..., 1:].to(conv_states.dtype))
    return _depthwise_silu(window, weight)[..., -1].to(x.dtype)


def _depthwise_silu(window: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[N, C, L] (weight's dtype) -> silu(valid depthwise conv) [N, C, L-K+1], rounded as
    transformers rounds it: one F.conv1d in the weight's dtype, SiLU in that dtype."""
    out = F.conv1d(window, weight.unsqueeze(1), groups=weight.shape[0])
    return F.silu(out)


# --- gated delta rule ------------------------------------------------------------------------


def _float_heads(
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
class _BlockLayout:
    """Where a step's tokens go in blocks of `block` tokens, on the host.

    Sequences are taken longest first (`order`), and blocks step by step: all sequences' first
    blocks, then the second blocks of those that have one, and so on. The sequences with a j-th
    block are then the first `active[j]` in `order`, and their j-th blocks lie side by side, so
    the scan over blocks works on slices of the state and of the blocks."""

    order: list[int]  # sequence indices, most blocks first
    active: list[int]  # per scan step: how many sequences (a prefix of `order`) have a block
    gather: list[int]  # per block position: the token there, or T (a zero row) past the end
    token_pos: list[int]  # per token: its position in the blocks, flattened

    @classmethod
    def build(cls, lengths: list[int], block: int) -> _BlockLayout:
        blocks = [-(-length // block) for length in lengths]
        starts = [0]
        for length in lengths[:-1]:
            starts.append(starts[-1] + length)
        order = sorted(range(len(lengths)), key=lambda b: -blocks[b])
        total = sum(lengths)
        steps = max(blocks, default=0)
        active = [sum(1 for n in blocks if n > j) for j in range(steps)]
        gather: list[int] = []
        token_pos = [0] * total
        for j, count in enumerate(active):
            for b in order[:count]:
                first = starts[b] + j * block
                size = min(block, lengths[b] - j * block)
                token_pos[first : first + size] = range(len(gather), len(gather) + size)
                gather.extend(range(first, first + size))
                gather.extend([total] * (block - size))
        return cls(order, active, gather, token_pos)


@dataclass(frozen=True)
class _BlockTerms:
    """Per block, what the scan needs beside the state S0 the block starts from (UT transform):
    with gamma_i the decay from the block's start through token i, the rule's corrections are
    delta = u - w S0, the outputs o = q_read S0 + attn delta, and the state after the block
    decay S0 + k_rest^T delta."""

    u: torch.Tensor  # [N, H, C, Dv]
    w: torch.Tensor  # [N, H, C, Dk]
    q_read: torch.Tensor  # [N, H, C, Dk]: gamma_i q_i
    attn: torch.Tensor  # [N, H, C, C]: causal (q_i . k_j) gamma_i / gamma_j
    k_rest: torch.Tensor  # [N, H, C, Dk]: k_j gamma_last / gamma_j
    decay: torch.Tensor  # [N, H, 1, 1]: gamma_last


def _block_terms(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> _BlockTerms:
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
    return _BlockTerms(
        u=u,
        w=w,
        q_read=q * gamma,
        attn=(q @ k.transpose(-1, -2)) * gap,
        k_rest=k * (last - log_gamma).exp().unsqueeze(-1),
        decay=last.exp().unsqueeze(-1),
    )


def _scan_blocks(terms: _BlockTerms, state: torch.Tensor, active: list[int]) -> torch.Tensor:
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
    out_dtype = q.dtype
    tokens, value_heads, value_dim = v.shape
    if not lengths:
        return v.new_empty(0, value_heads, value_dim, dtype=out_dtype)
    layout = _BlockLayout.build(lengths, CHUNK_SIZE)
    gather = torch.tensor(layout.gather, device=v.device)

    def blocks(x: torch.Tensor) -> torch.Tensor:
        """[T, H, ...] -> [N, H, C, ...] float32, positions past a sequence's end zero."""
        x = torch.cat([x.float(), x.new_zeros(1, *x.shape[1:], dtype=torch.float32)])
        x = x.index_select(0, gather).unflatten(0, (-1, CHUNK_SIZE))
        return x.transpose(1, 2)

    q, k = _float_heads(q, k, value_heads)
    terms = _block_terms(blocks(q), blocks(k), blocks(v), blocks(g), blocks(beta))
    order = torch.tensor(layout.order, device=v.device)
    seq_slots = slots.index_select(0, order)
    state = _starting_states(states, seq_slots, [fresh[b] for b in layout.order]).float()
    out = _scan_blocks(terms, state, layout.active)
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
    in q's dtype; states[slots] advanced by one token in place. Fixed shapes, no host reads."""
    out_dtype = q.dtype
    q, k = _float_heads(q, k, v.shape[1])
    v, g, beta = v.float(), g.float(), beta.float()
    state = states.index_select(0, slots).float() * g.exp()[..., None, None]  # [B, Hv, Dk, Dv]
    predicted = torch.einsum("bhkv,bhk->bhv", state, k)
    delta = (v - predicted) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    states.index_copy_(0, slots, state.to(states.dtype))
    return torch.einsum("bhkv,bhk->bhv", state, q).to(out_dtype)
