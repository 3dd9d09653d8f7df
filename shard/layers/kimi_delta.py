"""Sequence mixing of Kimi Delta Attention (KDA: Kimi Linear's and Ling/Ring hybrid's linear
layers; transformers' `chunk_kimi_delta_attention` and `recurrent_kimi_delta_attention`) for
packed, continuously batched steps.

KDA is Gated DeltaNet (shard/layers/gated_delta.py) with a decay per key channel instead of one
per head: each token's log decay g is a vector [Dk] per head, and the state [Dk, Dv] decays row
by row, S <- diag(exp(g)) S, before the delta rule corrects it toward the token's value,
S <- S + k (beta (v - S^T k))^T, and the query reads o = S^T q. The pools, the slots and the
rounding are Gated DeltaNet's (q and k L2-normalised in float32, q scaled by Dk**-0.5, the
output rounded to q's dtype).

- `kda_prefill`: ragged chunks of prompts in blocks of `CHUNK_SIZE` tokens (one triangular solve
  per block, the block scan shared with Gated DeltaNet); a sequence starts from zeros where
  `fresh`, else from its slot (chunked prefill).
- `kda_decode`: one token per sequence, fixed shapes, no host reads (CUDA-graph safe).
"""

from __future__ import annotations

import torch

from shard.layers.gated_delta import BlockTerms, gated_delta_decode, scan_prefill

# The per-channel decays between every two tokens of a block, [blocks, H, C, C, Dk] float32, are
# built this many elements at a time (256 MiB): a long prompt's would not fit at once.
PAIRWISE_ELEMENTS = 1 << 26


def _pairwise(
    left: torch.Tensor, right: torch.Tensor, log_gamma: torch.Tensor, causal: torch.Tensor
) -> torch.Tensor:
    """[N, H, C, C]: sum over key channels d of left_i[d] right_j[d] gamma_i[d] / gamma_j[d] for
    j <= i, zero above the diagonal. The ratio is exp of a difference of logs, masked to -inf
    above the diagonal before exp (where the difference is positive and could overflow)."""
    blocks, heads, size, dim = log_gamma.shape
    out = left.new_empty(blocks, heads, size, size)
    step = max(1, PAIRWISE_ELEMENTS // (heads * size * size * dim))
    for first in range(0, blocks, step):
        part = slice(first, first + step)
        lg = log_gamma[part]
        gap = (lg.unsqueeze(-2) - lg.unsqueeze(-3)).masked_fill(~causal[..., None], float("-inf"))
        out[part] = (left[part].unsqueeze(-2) * gap.exp() * right[part].unsqueeze(-3)).sum(-1)
    return out


def _block_terms(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> BlockTerms:
    """q, k, g [N, H, C, Dk], v [N, H, C, Dv], beta [N, H, C], float32 (padding all zeros: no
    decay, no write, no read).

    As Gated DeltaNet's terms, with gamma_i the per-channel decay from the block's start through
    token i: token i's correction satisfies (I + A) delta = beta v - (beta gamma k) S0 with
    A_ij = beta_i sum_d k_i[d] k_j[d] gamma_i[d] / gamma_j[d] for j < i."""
    size = g.shape[-2]
    log_gamma = g.cumsum(dim=-2)
    causal = torch.ones(size, size, dtype=torch.bool, device=g.device).tril()
    k_beta = k * beta.unsqueeze(-1)
    strictly_lower = _pairwise(k_beta, k, log_gamma, causal).tril(-1)
    rhs = torch.cat([v * beta.unsqueeze(-1), k_beta * log_gamma.exp()], dim=-1)
    solved = torch.linalg.solve_triangular(strictly_lower, rhs, upper=False, unitriangular=True)
    u, w = solved.split([v.shape[-1], k.shape[-1]], dim=-1)
    last = log_gamma[..., -1:, :]  # [N, H, 1, Dk]
    return BlockTerms(
        u=u,
        w=w,
        q_read=q * log_gamma.exp(),
        attn=_pairwise(q, k, log_gamma, causal),
        k_rest=k * (last - log_gamma).exp(),
        decay=last.exp().transpose(-1, -2),  # [N, H, Dk, 1]: each state row its channel's
    )


def kda_prefill(
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
    """Packed chunks of prompts: q, k, g [T, H, Dk] (g float32), v [T, H, Dv], beta [T, H] -> o
    [T, H, Dv] in q's dtype. Sequence b (lengths[b] tokens) starts from zeros if fresh[b], else
    from states[slots[b]], where its state after the chunk is written."""
    return scan_prefill(q, k, v, g, beta, states, slots, lengths, fresh, _block_terms)


def kda_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One token per sequence: q, k, g [B, H, Dk], v [B, H, Dv], beta [B, H] -> o [B, H, Dv] in
    q's dtype; states[slots] advanced in place. Gated DeltaNet's step, its decay per channel."""
    return gated_delta_decode(q, k, v, g, beta, states, slots)
