"""The LoRA kernels' entries of gpu_compile.py (which passes its compile and report functions
in): shrink and expand as a launch on contiguous tensors specialises them, with the GPU tile
configs, for Llama-3-8B's fused q/k/v (n_sub 3, slices 4096/1024/1024) and down projection."""

from __future__ import annotations

from collections.abc import Callable

import torch

from shard.platforms.cuda.kernels import dot_options, lora_expand, lora_shrink
from shard.platforms.cuda.kernels.lora_expand import default_expand_config
from shard.platforms.cuda.kernels.lora_shrink import default_shrink_config

TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
METADATA = ("order_ptr", "tile_slot_ptr", "tile_begin_ptr", "tile_end_ptr")


def compile_shrink(compile_kernel: Callable, report: Callable, dtype: torch.dtype, n_sub: int,
                   rank: int, block_m: int, split_k: int, k: int) -> None:  # fmt: skip
    t = TYPES[dtype]
    cfg = default_shrink_config(n_sub * rank, block_m, dtype)
    ptrs = {"x_ptr": f"*{t}", "a_ptr": f"*{t}", "out_ptr": "*fp32"}
    ptrs |= dict.fromkeys(METADATA, "*i32")
    unit = dict(stride_xk=1, stride_ak=1, stride_or=1)
    divisible = (*ptrs, "K", "stride_xt", "stride_as", "stride_aj", "stride_ar", "stride_ot")
    compiled = compile_kernel(
        lora_shrink._lora_shrink_kernel, ptrs,
        dict(RANK=rank, NR=n_sub * rank, BLOCK_M=block_m, BLOCK_Q=cfg.block_q,
             BLOCK_K=cfg.block_k, SPLIT_K=split_k, EVEN_K=k % cfg.block_k == 0, **unit,
             **dot_options(dtype)),
        divisible, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    report(f"lora_shrink {t} n_sub={n_sub} r={rank} M={block_m} split_k={split_k} {cfg}",
           compiled, allow_spills=dtype == torch.float32)  # fmt: skip


def compile_expand(compile_kernel: Callable, report: Callable, dtype: torch.dtype,
                   out_slices: tuple[int, ...], rank: int, block_m: int) -> None:  # fmt: skip
    t = TYPES[dtype]
    cfg = default_expand_config(rank, block_m, dtype)
    slices, tiles = [0], [0]
    for size in out_slices:
        slices.append(slices[-1] + size)
        tiles.append(tiles[-1] + -(-size // cfg.block_n))
    ptrs = {"h_ptr": "*fp32", "b_ptr": f"*{t}", "scaling_ptr": "*fp32", "y_ptr": f"*{t}"}
    ptrs |= dict.fromkeys(METADATA, "*i32")
    unit = dict(stride_hr=1, stride_br=1, stride_yn=1)
    divisible = (*ptrs, "stride_ht", "stride_hj", "stride_bs", "stride_bn", "stride_yt")
    compiled = compile_kernel(
        lora_expand._lora_expand_kernel, ptrs,
        dict(RANK=rank, N_SUB=len(out_slices), SLICE_BOUNDS=tuple(slices),
             TILE_BOUNDS=tuple(tiles), BLOCK_M=block_m, BLOCK_N=cfg.block_n,
             BLOCK_R=cfg.block_r, DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32",
             **unit),
        divisible, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    report(f"lora_expand {t} slices={out_slices} r={rank} M={block_m} {cfg}", compiled,
           allow_spills=dtype == torch.float32)  # fmt: skip


def compile_lora(compile_kernel: Callable, report: Callable, everything: bool) -> None:
    """Decode (16-token tiles, split-K) and prefill (64-token tiles) of a fused q/k/v at rank 16
    and of down_proj (K 14336) at rank 64, bf16; `everything` adds fp16, fp32 and rank 8."""
    qkv = (4096, 1024, 1024)
    compile_shrink(compile_kernel, report, torch.bfloat16, 3, 16, 16, 8, 4096)
    compile_shrink(compile_kernel, report, torch.bfloat16, 1, 64, 64, 1, 14336)
    compile_expand(compile_kernel, report, torch.bfloat16, qkv, 16, 16)
    compile_expand(compile_kernel, report, torch.bfloat16, (4096,), 64, 64)
    if everything:
        for dtype in (torch.float16, torch.float32):
            for block_m in (16, 64):
                compile_shrink(compile_kernel, report, dtype, 3, 8, block_m, 1, 4096)
                compile_shrink(compile_kernel, report, dtype, 2, 64, block_m, 4, 1000)
                compile_expand(compile_kernel, report, dtype, qkv, 8, block_m)
                compile_expand(compile_kernel, report, dtype, (14336, 14336), 128, block_m)
