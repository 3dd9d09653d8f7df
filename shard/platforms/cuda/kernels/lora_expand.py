"""LoRA expand: y[t, n] += scaling[s_t] * lora_b[s_t, n, :] . h[t, sub(n), :], in place, for
every token of a step in one launch (tokens with s_t = -1 are left alone).

Same design as the shrink (`lora_shrink.py`): a program takes a tile of up to BLOCK_M tokens of
one slot (`lora_tiles.py`) and BLOCK_N output features, loads the slot's B tile [BLOCK_N, R]
once for all of them, and does one [BLOCK_M, R] x [R, BLOCK_N] tile matmul (no loop over K:
the reduction is the rank). Decode tokens alone in their tile read B once each, as a per-token
kernel would; prefill tiles read it once per BLOCK_M tokens.

Fused layers: the grid's N axis runs over the tiles of every output slice in turn (each slice's
tiles start at the slice's start, so no tile straddles two sub-modules and a program reads one
sub-module's h); the slice bounds are compile-time constants, fixed per layer.

Numerics: h is fp32 and B is widened to fp32 (exactly), the sum over the rank is fp32, the
scaled term is added to y in fp32 and rounded once. fp32 models use ieee dots; 16-bit models
use TF32 dots, which round h to a 10-bit mantissa on a GPU (B loses nothing: fp16 and bf16 fit
TF32 exactly): a relative error of 2^-11 on the LoRA term alone, no more than the output's own
fp16 rounding, at tensor-core speed instead of ieee fp32 on the FMA units.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from shard.platforms.cuda.kernels import check_device, interpreting
from shard.platforms.cuda.kernels.lora_tiles import SlotTiles, default_block_m, slot_tiles


@triton.jit
def _lora_expand_kernel(
    h_ptr,
    b_ptr,
    scaling_ptr,
    y_ptr,
    order_ptr,
    tile_slot_ptr,
    tile_begin_ptr,
    tile_end_ptr,
    stride_ht,
    stride_hj,
    stride_hr,
    stride_bs,
    stride_bn,
    stride_br,
    stride_yt,
    stride_yn,
    RANK: tl.constexpr,
    N_SUB: tl.constexpr,
    SLICE_BOUNDS: tl.constexpr,  # (0, n_0, n_0 + n_1, ..., N): each slice's features
    TILE_BOUNDS: tl.constexpr,  # the same in N tiles: slice j has tiles TILE_BOUNDS[j] .. [j+1]
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    tile = tl.program_id(1)
    begin = tl.load(tile_begin_ptr + tile)
    end = tl.load(tile_end_ptr + tile)
    slot = tl.load(tile_slot_ptr + tile)
    if (begin >= end) | (slot < 0):
        return  # past the step's real tiles, or tokens without an adapter

    sub = 0
    n_begin = 0
    n_end = 0
    for j in tl.static_range(N_SUB):
        hit = (pid_n >= TILE_BOUNDS[j]) & (pid_n < TILE_BOUNDS[j + 1])
        sub = tl.where(hit, j, sub)
        n_begin = tl.where(hit, SLICE_BOUNDS[j] + (pid_n - TILE_BOUNDS[j]) * BLOCK_N, n_begin)
        n_end = tl.where(hit, SLICE_BOUNDS[j + 1], n_end)

    pos = begin + tl.arange(0, BLOCK_M)
    row_mask = pos < end
    # Clamped rather than masked (see lora_shrink.py): loaded, never stored.
    tokens = tl.load(order_ptr + tl.minimum(pos, end - 1)).to(tl.int64)
    offs_n = n_begin + tl.arange(0, BLOCK_N)
    n_mask = offs_n < n_end
    rows_n = tl.minimum(offs_n, n_end - 1)
    h_base = h_ptr + tokens[:, None] * stride_ht + sub * stride_hj  # [BLOCK_M, BLOCK_R]
    b_base = b_ptr + slot.to(tl.int64) * stride_bs + rows_n[None, :] * stride_bn

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r0 in tl.static_range(0, RANK, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        if RANK % BLOCK_R == 0:
            h = tl.load(h_base + offs_r[None, :] * stride_hr)
            b = tl.load(b_base + offs_r[:, None] * stride_br)  # B^T tile [BLOCK_R, BLOCK_N]
        else:  # ranks off the tile (8, 24...): padded with zeros
            h = tl.load(h_base + offs_r[None, :] * stride_hr, mask=offs_r[None, :] < RANK,
                        other=0.0)  # fmt: skip
            b = tl.load(b_base + offs_r[:, None] * stride_br, mask=offs_r[:, None] < RANK,
                        other=0.0)  # fmt: skip
        acc = tl.dot(h, b.to(tl.float32), acc, input_precision=DOT_PRECISION)

    scale = tl.load(scaling_ptr + slot)
    y_ptrs = y_ptr + tokens[:, None] * stride_yt + offs_n[None, :] * stride_yn
    mask = row_mask[:, None] & n_mask[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + scale * acc).to(y_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class ExpandConfig:
    block_n: int
    block_r: int  # rank per tile matmul: the whole rank up to this, else a loop
    num_warps: int
    num_stages: int


def default_expand_config(rank: int, block_m: int, dtype: torch.dtype) -> ExpandConfig:
    # Padded to a power of two, at least 16 (tl.dot's minimum).
    block_r = max(16, triton.next_power_of_2(rank))
    if interpreting():
        return ExpandConfig(16, min(block_r, 32), 1, 1)  # test shapes span several N tiles
    if dtype == torch.float32:
        # ieee dots on the FMA units hold both operands in registers: 128 x 64 tiles spilled
        # 6.9 KiB at 64 tokens (sm_90), rank tiles of 32 still 520 B.
        return ExpandConfig(64, 16, 4, 2)
    # Not yet tuned on a GPU (docs/kernels.md): 128 features x 64 tokens of fp32 accumulator
    # is 64 registers per thread at 4 warps; ranks up to 64 in one TF32 tile matmul.
    return ExpandConfig(128, min(block_r, 64), 4, 2)


def lora_expand(
    h: torch.Tensor,
    lora_b: torch.Tensor,
    token_slots: torch.Tensor,
    scaling: torch.Tensor,
    out_slices: tuple[int, ...],
    y: torch.Tensor,
    *,
    tiles: SlotTiles | None = None,
    config: ExpandConfig | None = None,
) -> None:
    """y [T, N] += per token t with token_slots[t] >= 0: scaling[s] * h[t, sub(n)] @ lora_b[s]^T,
    in place. h fp32 [T, n_sub, R], lora_b [S, N, R] (y's dtype), scaling fp32 [S], out_slices
    n_sub sizes summing to N. `tiles`: as for lora_shrink, built here when not given (it must
    have been built from the same token_slots)."""
    num_tokens, n = y.shape
    num_slots, n_b, rank = lora_b.shape
    n_sub = len(out_slices)
    if h.shape != (num_tokens, n_sub, rank) or h.dtype != torch.float32:
        raise ValueError(f"h {h.dtype} {tuple(h.shape)}: want fp32 {(num_tokens, n_sub, rank)}")
    if n_b != n or sum(out_slices) != n or min(out_slices, default=0) < 0:
        raise ValueError(f"out_slices {out_slices} and lora_b {tuple(lora_b.shape)} for N={n}")
    if lora_b.dtype != y.dtype or y.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"lora_b {lora_b.dtype} and y {y.dtype}: one of fp16, bf16, fp32")
    if scaling.shape != (num_slots,) or scaling.dtype != torch.float32:
        raise ValueError(f"scaling {scaling.dtype} {tuple(scaling.shape)}: want fp32 [{num_slots}]")
    if token_slots.shape != (num_tokens,):
        raise ValueError(f"token_slots {tuple(token_slots.shape)} for {num_tokens} tokens")
    if num_tokens == 0 or n == 0 or rank == 0:
        return
    check_device(h, lora_b, token_slots, scaling, y)
    if tiles is None:
        tiles = slot_tiles(token_slots, num_slots, default_block_m(num_tokens))
    cfg = config or default_expand_config(rank, tiles.block_m, y.dtype)
    slice_bounds, tile_bounds = [0], [0]
    for size in out_slices:
        slice_bounds.append(slice_bounds[-1] + size)
        tile_bounds.append(tile_bounds[-1] + triton.cdiv(size, cfg.block_n))
    _lora_expand_kernel[(tile_bounds[-1], tiles.max_tiles)](
        h,
        lora_b,
        scaling,
        y,
        tiles.order,
        tiles.tile_slot,
        tiles.tile_begin,
        tiles.tile_end,
        *h.stride(),
        *lora_b.stride(),
        *y.stride(),
        RANK=rank,
        N_SUB=n_sub,
        SLICE_BOUNDS=tuple(slice_bounds),
        TILE_BOUNDS=tuple(tile_bounds),
        BLOCK_M=tiles.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_R=cfg.block_r,
        DOT_PRECISION="ieee" if y.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
