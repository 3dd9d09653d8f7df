"""Combines the per-split partial results of split-K paged decode into the final output.

Each split s left o_s (its softmax-normalised output) and lse_s (log2 of its softmax
denominator, in the base-2 score domain). The exact result is
sum_s 2^(lse_s - lse_max) o_s / sum_s 2^(lse_s - lse_max). Splits that started past a sequence's
end have lse = -inf and o = 0, so they weigh exactly nothing. (With a sliding window, split 0
starts at the window's first position.) An attention sink (SINKS, gpt-oss) is one more part:
lse = the sink in base 2, o = 0, so it adds to the denominator only, once per head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    sinks_ptr,
    stride_ob,
    stride_oh,
    stride_od,
    NUM_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq.to(tl.int64) * NUM_HEADS + head
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    lse = tl.load(part_lse_ptr + row * NUM_SPLITS + offs_s, mask=s_mask, other=float("-inf"))
    # Split 0 always holds the first token the query sees, so lse_max is finite.
    lse_max = tl.max(lse, 0)
    if SINKS:
        sink = tl.load(sinks_ptr + head) * 1.4426950408889634  # log2(e): base 2, as lse
        lse_max = tl.maximum(lse_max, sink)
    weight = tl.exp2(lse - lse_max)
    denominator = tl.sum(weight, 0)
    if SINKS:
        denominator += tl.exp2(sink - lse_max)
    parts = tl.load(
        part_out_ptr + (row * NUM_SPLITS + offs_s[:, None]) * HEAD_DIM + offs_d[None, :],
        mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )
    out = tl.sum(parts * weight[:, None], 0) / denominator
    tl.store(
        out_ptr + seq * stride_ob + head * stride_oh + offs_d * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


def decode_reduce(
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    out: torch.Tensor,
    sinks: torch.Tensor | None = None,
) -> None:
    """part_out [B, H, S, D] fp32, part_lse [B, H, S] fp32 -> out [B, H, D] (written in place);
    `sinks` [H] float32: each head's attention sink, counted once."""
    batch, num_heads, num_splits, head_dim = part_out.shape
    _decode_reduce_kernel[(batch, num_heads)](
        part_out,
        part_lse,
        out,
        part_lse if sinks is None else sinks,  # a dummy where SINKS is compiled out
        *out.stride(),
        NUM_HEADS=num_heads,
        NUM_SPLITS=num_splits,
        BLOCK_S=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        SINKS=sinks is not None,
    )
