"""LoRA shrink: h[t, j, :] = lora_a[s_t, j] @ x[t] for every token of a step in one launch,
each token with its own adapter slot s_t (h = 0 where s_t = -1). fp32 accumulation, fp32 h.

One design for decode and prefill. Tokens are grouped by slot (`lora_tiles.py`); a program
takes a tile of up to BLOCK_M tokens of one slot, gathers their x rows (each row contiguous, so
the gather costs nothing over a dense load) and multiplies them by that slot's A tile. Prefill
chunks fill whole tiles, so A is read once per BLOCK_M tokens (SGMV); a decode token whose
adapter no other token uses is alone in its tile and A is read once for it, the same traffic as
a per-token kernel (BGMV), the padded tile rows costing only tensor-core time, which a
bandwidth-bound kernel has to spare. Decode tokens of one adapter share its A reads wherever
they sit in the batch, which neither per-token nor consecutive-segment kernels do.

The n_sub sub-modules' A matrices [n_sub, R, K] are one [n_sub * R, K] matrix: a fused q/k/v
layer is one GEMM of width 3R, x read once for all three. Split-K: small steps have few tiles,
so K is cut into splits writing fp32 partials that one torch sum adds up in a fixed order
(deterministic, unlike atomics, and no memset: every program writes its whole block).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from shard.platforms.cuda.kernels import check_device, dot_options, interpreting
from shard.platforms.cuda.kernels.decode import num_sms
from shard.platforms.cuda.kernels.lora_tiles import SlotTiles, default_block_m, slot_tiles

MIN_K_TILES_PER_SPLIT = 2  # a pipelined loop needs a few iterations
MAX_SPLIT_K = 16


@triton.jit
def _lora_shrink_kernel(
    x_ptr,
    a_ptr,
    out_ptr,
    order_ptr,
    tile_slot_ptr,
    tile_begin_ptr,
    tile_end_ptr,
    K,
    stride_xt,
    stride_xk,
    stride_as,
    stride_aj,
    stride_ar,
    stride_ak,
    stride_os,
    stride_ot,
    stride_oj,
    stride_or,
    RANK: tl.constexpr,
    NR: tl.constexpr,  # n_sub * RANK: the rows of the fused A
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    # Rows of A are the fastest grid axis: programs of one token tile run together and share
    # its x rows in L2.
    pid_q = tl.program_id(0)
    tile = tl.program_id(1)
    split = tl.program_id(2)
    begin = tl.load(tile_begin_ptr + tile)
    end = tl.load(tile_end_ptr + tile)
    if begin >= end:
        return  # past the step's real tiles
    slot = tl.load(tile_slot_ptr + tile)

    pos = begin + tl.arange(0, BLOCK_M)
    row_mask = pos < end
    # Rows past the group's end and A rows past NR are clamped, not masked: they load real data
    # that is never stored, so the hot loop's loads stay unmasked (vectorised, pipelined).
    tokens = tl.load(order_ptr + tl.minimum(pos, end - 1)).to(tl.int64)
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    q_mask = offs_q < NR
    q = tl.minimum(offs_q, NR - 1)
    sub = q // RANK
    r = q % RANK
    offs_k = tl.arange(0, BLOCK_K)
    x_base = x_ptr + tokens[:, None] * stride_xt  # [BLOCK_M, BLOCK_K]
    a_base = a_ptr + slot.to(tl.int64) * stride_as + (sub * stride_aj + r * stride_ar)[None, :]

    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_begin = split * per_split * BLOCK_K
    k_end = tl.minimum(k_begin + per_split * BLOCK_K, K)
    k_end = tl.where(slot < 0, k_begin, k_end)  # no adapter: h = 0, nothing to read

    acc = tl.zeros([BLOCK_M, BLOCK_Q], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        ks = k0 + offs_k
        if EVEN_K:
            xk = tl.load(x_base + ks[None, :] * stride_xk)
            ak = tl.load(a_base + ks[:, None] * stride_ak)  # A^T tile [BLOCK_K, BLOCK_Q]
        else:
            xk = tl.load(x_base + ks[None, :] * stride_xk, mask=ks[None, :] < K, other=0.0)
            ak = tl.load(a_base + ks[:, None] * stride_ak, mask=ks[:, None] < K, other=0.0)
        if DOT_UPCAST:  # interpreter only, see shard.platforms.cuda.kernels.dot_options
            xk = xk.to(tl.float32)
            ak = ak.to(tl.float32)
        acc = tl.dot(xk, ak, acc, input_precision=DOT_PRECISION)

    o_ptrs = (
        out_ptr
        + split * stride_os
        + tokens[:, None] * stride_ot
        + (sub * stride_oj + r * stride_or)[None, :]
    )
    tl.store(o_ptrs, acc, mask=row_mask[:, None] & q_mask[None, :])


@dataclass(frozen=True)
class ShrinkConfig:
    block_q: int  # rows of the fused A [n_sub * R, K] per program
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int | None = None  # None: choose_split_k decides


def default_shrink_config(nr: int, block_m: int, dtype: torch.dtype) -> ShrinkConfig:
    # Up to 64 rows of A in one program: a fused q/k/v of rank 16 is one 48 (-> 64) wide tile.
    block_q = max(16, min(64, triton.next_power_of_2(nr)))
    if interpreting():
        # Small K tiles so that test shapes span several of them and the split-K path.
        return ShrinkConfig(block_q, 32, 1, 1)
    if dtype == torch.float32:  # ieee dots on the FMA units; twice the bytes per tile
        return ShrinkConfig(block_q, 32, 4, 2)
    # Not yet tuned on a GPU (docs/kernels.md). Decode tiles stream A (64 x 128 x 2 B = 16 KiB
    # per stage, 4 in flight); prefill tiles hold 64 tokens x 64 of K, one 128-byte swizzled
    # row of 16-bit x per stage.
    if block_m <= 16:
        return ShrinkConfig(block_q, 128, 4, 4)
    return ShrinkConfig(block_q, 64, 4, 3)


def choose_split_k(programs: int, k_tiles: int, sms: int) -> int:
    """Splits until the grid has a program per SM. `programs` is a lower bound (tokens may fill
    more tiles than ceil(T / BLOCK_M) once grouped by slot; the host cannot know without a
    sync), so a batch of many adapters may get splits it did not need, which costs only the
    partials' (small) traffic."""
    if programs >= sms:
        return 1
    split = min(triton.cdiv(sms, programs), k_tiles // MIN_K_TILES_PER_SPLIT, MAX_SPLIT_K)
    return max(1, split)


def lora_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    token_slots: torch.Tensor,
    *,
    tiles: SlotTiles | None = None,
    config: ShrinkConfig | None = None,
) -> torch.Tensor:
    """x [T, K] (fp16/bf16/fp32), lora_a [S, n_sub, R, K] (x's dtype), token_slots int [T]
    (-1: no adapter) -> h fp32 [T, n_sub, R].

    `tiles`: the step's grouping (`slot_tiles(token_slots, S, default_block_m(T))`), built once
    per step and shared by every layer; built here when not given.
    """
    num_tokens, k = x.shape
    num_slots, n_sub, rank, k_a = lora_a.shape
    if k_a != k or lora_a.dtype != x.dtype:
        raise ValueError(f"lora_a {lora_a.dtype} {tuple(lora_a.shape)} does not fit x {x.dtype} "
                         f"{tuple(x.shape)}")  # fmt: skip
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    if token_slots.shape != (num_tokens,):
        raise ValueError(f"token_slots {tuple(token_slots.shape)} for {num_tokens} tokens")
    h = torch.empty(num_tokens, n_sub, rank, dtype=torch.float32, device=x.device)
    if num_tokens == 0 or rank == 0 or n_sub == 0:
        return h
    if k == 0:
        return h.zero_()
    check_device(x, lora_a, token_slots)
    if tiles is None:
        tiles = slot_tiles(token_slots, num_slots, default_block_m(num_tokens))
    nr = n_sub * rank
    cfg = config or default_shrink_config(nr, tiles.block_m, x.dtype)
    q_tiles = triton.cdiv(nr, cfg.block_q)
    k_tiles = triton.cdiv(k, cfg.block_k)
    split_k = cfg.split_k
    if split_k is None:
        programs = triton.cdiv(num_tokens, tiles.block_m) * q_tiles
        split_k = choose_split_k(programs, k_tiles, num_sms(x.device))
    # Equal whole numbers of K tiles per split, none empty.
    split_k = max(1, min(split_k, k_tiles))
    split_k = triton.cdiv(k_tiles, triton.cdiv(k_tiles, split_k))
    out = h if split_k == 1 else torch.empty((split_k, *h.shape), dtype=h.dtype, device=h.device)
    stride_split = 0 if split_k == 1 else out.stride(0)
    _lora_shrink_kernel[(q_tiles, tiles.max_tiles, split_k)](
        x,
        lora_a,
        out,
        tiles.order,
        tiles.tile_slot,
        tiles.tile_begin,
        tiles.tile_end,
        k,
        *x.stride(),
        *lora_a.stride(),
        stride_split,
        *out.stride()[-3:],
        RANK=rank,
        NR=nr,
        BLOCK_M=tiles.block_m,
        BLOCK_Q=cfg.block_q,
        BLOCK_K=cfg.block_k,
        SPLIT_K=split_k,
        EVEN_K=k % cfg.block_k == 0,
        **dot_options(x.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if split_k > 1:
        torch.sum(out, dim=0, out=h)
    return h
