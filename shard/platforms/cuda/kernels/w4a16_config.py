"""Tile configs and the split-K heuristic of the W4A16 GEMM (shard/platforms/cuda/kernels/w4a16.py).

None of this is tuned on a GPU yet: these are starting points reasoned from the H100's numbers
(docs/kernels.md, "W4A16 GEMM"); `bench/kernels.py --sweep` times the candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from shard.platforms.cuda.kernels import interpreting


@dataclass(frozen=True)
class W4A16Config:
    block_m: int  # tokens per tile (the tile matmul's N)
    block_n: int  # output features per tile (the tile matmul's M: 64 per warpgroup)
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int | None = None  # None: choose_split_k decides
    # Apply the group scale to the [BLOCK_N, BLOCK_M] product instead of every weight element
    # (only when a K tile lies in one group; see w4a16.py).
    scale_after_dot: bool = False


# Up to this many tokens a weight tile is reused too little for the GEMM to be compute-bound
# (the H100's fp16 ridge is ~295 FLOP per byte; an int4 weight element is half a byte and feeds
# 2 M FLOPs): such grids want several programs per SM in flight, and their split-K partials
# must stay small next to the weight bytes.
MEMORY_BOUND_M = 64
SKINNY_M = 16  # decode: one 16-token tile
WAVES = 4  # programs per SM a memory-bound grid aims for (several loads in flight per SM)
MIN_K_TILES_PER_SPLIT = 4  # a num_stages-deep pipeline needs a few iterations to fill
MAX_SPLIT_K = 16


def block_k(preferred: int, group_size: int) -> int:
    """`preferred`, or the largest power of two below it dividing group_size (then a K tile lies
    in one group: one row of scales per tile), but at least 16 (tl.dot's minimum; smaller
    group sizes take the per-row group path)."""
    return max(16, min(preferred, group_size & -group_size))


def default_config(
    m: int, n: int, group_size: int, dtype: torch.dtype, sms: int, act_order: bool = False
) -> W4A16Config:
    if interpreting():
        # Small tiles so that test shapes span several tiles along every dimension; the
        # interpreter's cost is per tile operation, not per element.
        return W4A16Config(16, 16, block_k(32, group_size), 1, 1, scale_after_dot=m <= SKINNY_M)
    if dtype == torch.float32:
        # ieee fp32 dots run on the FMA units, not tensor cores, and fp32 x tiles take twice
        # the shared memory: modest tiles.
        return W4A16Config(16 if m <= SKINNY_M else 64, 64, block_k(32, group_size), 4, 2)
    if act_order:
        # Scales and zeros are gathered per element: registers grow with BLOCK_N * BLOCK_K per
        # thread, so 16 per thread (64x128 tiles spilled at sm_90, 792 bytes of stack).
        if m <= MEMORY_BOUND_M:
            return W4A16Config(max(16, triton.next_power_of_2(m)), 64, 32, 4, 4)
        return W4A16Config(128, 128, 32, 8, 3)
    if m <= SKINNY_M:
        # Decode, bandwidth-bound: 64 weight rows per program is one warpgroup's wgmma M (4
        # warps); a K tile of 128 (one whole group at the usual group size) is 4 KiB of int4 per
        # stage, 4 stages keep 16 KiB per program in flight. Split-K gives the grid its width.
        return W4A16Config(16, 64, block_k(128, group_size), 4, 4, scale_after_dot=True)
    if m <= MEMORY_BOUND_M:
        return W4A16Config(triton.next_power_of_2(m), 128, block_k(64, group_size), 4, 4)
    # Prefill, compute-bound: 128 weight rows = two warpgroups (8 warps). Dequantizing costs
    # ~9 instructions per weight element and thread (sm_90 SASS of the loop), ~580 issue cycles
    # per 128x64 weight tile, which a 128-token tile's wgmmas (512 cycles at 2048 FMA/clk/SM)
    # cannot hide and a 256-token tile's (1024) can; 256 needs 239 registers per thread (no
    # spills; with 32-row K tiles, for groups of 32, it spills) and 120 KiB of shared memory at
    # 3 stages, so it is used where it still fills the SMs. BLOCK_K 64: one 128-byte swizzled
    # row of 16-bit x per stage.
    bk = block_k(64, group_size)
    wide = bk == 64 and triton.cdiv(m, 256) * triton.cdiv(n, 128) >= sms
    return W4A16Config(256 if wide else 128, 128, bk, 8, 3)


# The smallest weight tile compiled for a GPU, in packed int32 words (BLOCK_N x BLOCK_K / 8).
# On an H100 with triton 3.6, 16 x 16 tiles (16 x 2 words) gave wrong products whatever the
# M tile, warps, stages or split (while the dequantization alone was exact), and every larger
# tile probed was right: 64 x 16 (128 words) and 16 x 32 (64 words) (docs/benchmarks.md,
# "First GPU session"). default_config never picks one so small; an explicit one is refused.
MIN_GPU_TILE_WORDS = 64


def check_tile(cfg: W4A16Config, compiled: bool) -> None:
    """Refuses, compiled for a GPU, a tile known to be miscompiled (MIN_GPU_TILE_WORDS)."""
    words = cfg.block_n * cfg.block_k // 8
    if compiled and words < MIN_GPU_TILE_WORDS:
        raise ValueError(
            f"{cfg}: a {cfg.block_n} x {cfg.block_k} weight tile ({words} int32 words) is "
            f"below the {MIN_GPU_TILE_WORDS} words known to compile correctly for a GPU"
        )


def choose_split_k(tiles: int, k_tiles: int, sms: int, m: int, k: int) -> int:
    """1 when the output tiles already fill the GPU (WAVES programs per SM when memory-bound,
    one per SM otherwise); else enough splits to get there, each at least MIN_K_TILES_PER_SPLIT
    K tiles long. Memory-bound, the partials' traffic (8 bytes per output per split: written,
    read back) stays under half the int4 weight bytes (K/2 per output column): splits <= K/16M.
    """
    memory_bound = m <= MEMORY_BOUND_M
    target = WAVES * sms if memory_bound else sms
    if tiles >= target:
        return 1
    split = min(triton.cdiv(target, tiles), k_tiles // MIN_K_TILES_PER_SPLIT, MAX_SPLIT_K)
    if memory_bound:
        split = min(split, k // (16 * m))
    return max(1, split)
