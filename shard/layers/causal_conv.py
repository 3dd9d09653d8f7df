"""The causal depthwise convolution before a recurrent mixer's scan (Gated DeltaNet's over q, k
and v; Mamba 2's over x, B and C), then SiLU (`silu`; LFM2's short convolution has none), for
packed, continuously batched steps.

Each sequence keeps its last K-1 inputs in `conv_states` [S, C, K-1] (model dtype), one slot per
sequence. Rounding follows transformers: one F.conv1d in the weight's dtype (its bias included),
SiLU in that dtype, then the input's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shard.layers.recurrent_steps import starting_states


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    slots: torch.Tensor,
    lengths: list[int],
    fresh: list[bool],
    bias: torch.Tensor | None = None,
    silu: bool = True,
) -> torch.Tensor:
    """silu(causal depthwise conv) (or the conv alone, `silu` False) of packed chunks: x [T, C],
    weight [C, K] (and a bias [C] where the checkpoint has one) -> [T, C] in x's dtype; each
    sequence's last K-1 inputs (older ones from its state where its chunk is shorter)
    written to conv_states[slots[b]].

    All sequences go through one conv: each one's history columns followed by its tokens, laid
    end to end, so that every output whose window lies inside one sequence's stretch is that
    sequence's, and the outputs whose window straddles two stretches are dropped."""
    history = weight.shape[-1] - 1
    if not lengths:
        return x.new_empty(0, x.shape[1])
    prev = starting_states(conv_states, slots, fresh).to(weight.dtype)  # [B, C, K-1]
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
    out = _depthwise(window.unsqueeze(0), weight, bias, silu)[0]  # [C, outputs]
    return out[:, torch.tensor(token_cols, device=x.device)].t().to(x.dtype)


def causal_conv1d_decode(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    slots: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu: bool = True,
) -> torch.Tensor:
    """One token per sequence: x [B, C] -> silu(conv) (or the conv, `silu` False) [B, C] in x's
    dtype; conv_states[slots]
    shifted by one input. Fixed shapes, no host reads: safe to capture in a CUDA graph."""
    prev = conv_states.index_select(0, slots).to(weight.dtype)  # [B, C, K-1]
    window = torch.cat([prev, x.to(weight.dtype).unsqueeze(-1)], dim=-1)  # [B, C, K]
    conv_states.index_copy_(0, slots, window[..., 1:].to(conv_states.dtype))
    return _depthwise(window, weight, bias, silu)[..., -1].to(x.dtype)


def _depthwise(
    window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool
) -> torch.Tensor:
    """[N, C, L] (weight's dtype) -> silu(valid depthwise conv) [N, C, L-K+1] (or the conv
    alone), rounded as transformers rounds it: one F.conv1d in the weight's dtype, SiLU in that
    dtype."""
    out = F.conv1d(window, weight.unsqueeze(1), bias, groups=weight.shape[0])
    return F.silu(out) if silu else out
