"""Compiles the kernels for a Hopper GPU (sm_90) down to a cubin, on a machine without one.

The interpreter runs kernels as Python and never sees triton's compiler, so code it accepts can
still fail to compile (an unsupported construct, too much shared memory for a tile config).
Triton's wheel carries ptxas, so the whole pipeline runs here. Must run without
TRITON_INTERPRET (interpreted kernels cannot be compiled); test_gpu_compile.py runs it in a
subprocess. Prints one line per kernel with its shared memory.

    .venv/bin/python tests/kernels/gpu_compile.py [--all]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
from gpu_compile_lora import compile_lora  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from shard.platforms.cuda.kernels import (  # noqa: E402
    decode,
    decode_reduce,
    dot_options,
    elementwise,
    head_block,
    interpreting,
    kv_write,
    prefill,
    truncation,
    w4a16,
)
from shard.platforms.cuda.kernels.w4a16_config import W4A16Config, default_config  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
H100_SHARED_BYTES = 227 * 1024
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def compile_kernel(
    fn, pointers: dict[str, str], constexprs: dict, divisible: tuple[str, ...] = (), **options
) -> int:
    """Compiles `fn` with the named pointer/float args typed, other args i32 (strides, lengths);
    returns the shared memory it needs. `divisible` names the args a launch would find
    divisible by 16 (triton's JIT specialises on that: it decides vector widths, and whether a
    load can be pipelined with cp.async at all)."""
    signature = {
        name: "constexpr" if name in constexprs else pointers.get(name, "i32")
        for name in fn.arg_names
    }
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible}
    source = ASTSource(fn, signature, constexprs, attrs)
    kernel = triton.compile(source, target=HOPPER, options=options)
    return kernel.metadata.shared, registers_and_spills(kernel.asm["cubin"])


def registers_and_spills(cubin: bytes) -> tuple[int, int]:
    """Registers per thread and bytes of stack (register spills), read from the cubin with the
    cuobjdump that triton's wheel ships (without a GPU, triton itself cannot tell)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run(
            [triton.knobs.nvidia.cuobjdump.path, "-res-usage", f.name],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    assert found, usage
    return int(found.group(1)), int(found.group(2))


def compile_prefill(
    dtype: torch.dtype,
    head_dim: int,
    sliding: bool = False,
    softcap: bool = False,
    sinks: bool = False,
    chunked: bool = False,
    alibi: bool = False,
) -> None:
    t = TYPES[dtype]
    cfg = prefill.default_prefill_config(head_dim, dtype)
    ptrs = {n: f"*{t}" for n in ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "cache_ptr")}
    ptrs |= {n: "*i32" for n in ("block_tables_ptr", "context_lens_ptr")}
    ptrs |= {"cu_seqlens_q_ptr": "*i32", "cu_seqlens_k_ptr": "*i32", "scale_log2": "fp32"}
    ptrs |= {"softcap_log2": "fp32", "sinks_ptr": "*fp32", "alibi_ptr": "*fp32"}
    ptrs["stride_c_kv"] = "i64"  # a large cache's K-to-V distance passes 2^31 elements
    compiled = compile_kernel(
        prefill._prefill_kernel, ptrs,
        dict(GROUP=4, HEAD_DIM=head_dim, BLOCK_D=head_block(head_dim), BLOCK_M=cfg.block_m,
             BLOCK_N=cfg.block_n, CACHE_BLOCK_SIZE=16, HAS_PREFIX=True, SLIDING=sliding,
             CHUNKED=chunked, SOFTCAP=softcap, SINKS=sinks, ALIBI=alibi, **dot_options(dtype)),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    what = f"prefill {t} d{head_dim} sliding={sliding} chunked={chunked} softcap={softcap}"
    what += f" sinks={sinks} alibi={alibi}"
    report(f"{what} {cfg}", compiled)


def compile_decode(
    dtype: torch.dtype,
    head_dim: int,
    splits: int,
    sliding: bool = False,
    per_sequence: bool = False,
    softcap: bool = False,
    sinks: bool = False,
    chunked: bool = False,
    alibi: bool = False,
) -> None:
    t = TYPES[dtype]
    cfg = decode.default_decode_config(head_dim)
    ptrs = {n: f"*{t}" for n in ("q_ptr", "cache_ptr", "out_ptr")}
    ptrs |= {"block_tables_ptr": "*i32", "context_lens_ptr": "*i32", "scale_log2": "fp32"}
    ptrs |= {"softcap_log2": "fp32", "sinks_ptr": "*fp32", "alibi_ptr": "*fp32"}
    ptrs |= {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "stride_c_kv": "i64"}
    compiled = compile_kernel(
        decode._paged_decode_kernel, ptrs,
        dict(NUM_HEADS=32, GROUP=4, BLOCK_G=16, HEAD_DIM=head_dim, BLOCK_D=head_block(head_dim),
             BLOCK_N=cfg.block_n, CACHE_BLOCK_SIZE=16, NUM_SPLITS=splits, SLIDING=sliding,
             CHUNKED=chunked, SPLIT_PER_SEQUENCE=per_sequence, SOFTCAP=softcap, SINKS=sinks,
             ALIBI=alibi, **dot_options(dtype)),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    name = f"decode {t} d{head_dim} splits={splits} sliding={sliding} per_seq={per_sequence}"
    name += f" chunked={chunked} softcap={softcap} sinks={sinks} alibi={alibi}"
    report(f"{name} {cfg}", compiled)


def compile_reduce_and_kv_write(dtype: torch.dtype, head_dim: int) -> None:
    t = TYPES[dtype]
    compiled = compile_kernel(
        decode_reduce._decode_reduce_kernel,
        {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": f"*{t}",
         "sinks_ptr": "*fp32"},
        dict(NUM_HEADS=32, NUM_SPLITS=8, BLOCK_S=8, HEAD_DIM=head_dim,
             BLOCK_D=triton.next_power_of_2(head_dim), SINKS=True),
    )  # fmt: skip
    report(f"decode_reduce {t} d{head_dim} sinks", compiled)
    compiled = compile_kernel(
        kv_write._kv_write_kernel,
        {"key_ptr": f"*{t}", "value_ptr": f"*{t}", "cache_ptr": f"*{t}", "slot_ptr": "*i64",
         "stride_c_kv": "i64"},
        dict(BLOCK_SIZE=16, NUM_KV_HEADS=8, HEAD_DIM=head_dim, BLOCK_H=8,
             BLOCK_D=head_block(head_dim)),
    )  # fmt: skip
    report(f"kv_write {t} d{head_dim}", compiled)


def compile_elementwise(dtype: torch.dtype) -> None:
    """The fused norm, SwiGLU and rotary kernels (elementwise.py) at Llama-3-8B's widths."""
    t = TYPES[dtype]
    ptrs = {n: f"*{t}" for n in ("x_ptr", "residual_ptr", "weight_ptr", "out_ptr", "sum_ptr")}
    compiled = compile_kernel(
        elementwise._rms_norm_kernel, ptrs | {"eps": "fp32"},
        dict(HAS_RESIDUAL=True, BLOCK=4096), num_warps=8,
    )  # fmt: skip
    report(f"rms_norm+residual {t} 4096", compiled)
    compiled = compile_kernel(
        elementwise._silu_mul_kernel, {"product_ptr": f"*{t}", "out_ptr": f"*{t}"},
        dict(BLOCK=1024),
    )  # fmt: skip
    report(f"silu_mul {t}", compiled)
    compiled = compile_kernel(
        elementwise._rotary_kernel,
        {"x_ptr": f"*{t}", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "positions_ptr": "*i64"},
        dict(HALF=64, BLOCK_H=16, BLOCK_D=64),
    )  # fmt: skip
    report(f"rotary {t} d128", compiled)


def compile_truncation_floor() -> None:
    """The sampler's sort-free kept floor (truncation.py) at its launch's block and split."""
    ptrs = {"x_ptr": "*fp32", "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32",
            "out_ptr": "*fp32"}  # fmt: skip
    compiled = compile_kernel(
        truncation._floor_kernel, ptrs,
        dict(BLOCK=truncation.BLOCK, SPLIT=truncation.SPLIT, PASSES=truncation.SEARCH_PASSES),
        num_warps=8,
    )  # fmt: skip
    report("truncation floor fp32", compiled)


def compile_fused_moe(
    dtype: torch.dtype, weight: str, act_order: bool = False, gated: bool = True
) -> None:
    """The fused MoE's two grouped GEMMs (fused_moe.py) at Qwen3-30B-A3B's tiles, with experts
    of `weight`: "dense" (x's dtype), "fp8" (FP8_W: tiles scaled in registers) or "int4"
    (INT4_W: int4 tiles dequantized in registers; groups of 128, or act-order's per row);
    `gated` False: Nemotron 3's ungated relu^2 experts."""
    from shard.platforms.cuda.kernels import fused_moe

    t = TYPES[dtype]
    w = {"dense": t, "fp8": "fp8e4nv", "int4": "i32"}[weight]
    ptrs = {"x_ptr": f"*{t}", "h_ptr": f"*{t}", "w_ptr": f"*{w}", "b_ptr": f"*{t}",
            "s_ptr": "*fp16" if weight == "int4" else "*fp32", "z_ptr": "*u8", "gi_ptr": "*i32",
            "out_ptr": f"*{t}", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32",
            "total_ptr": "*i32", "weights_ptr": "*fp32", "alpha": "fp32",
            "limit": "fp32"}  # fmt: skip
    int4 = weight == "int4"
    tiles = dict(FP8_W=weight == "fp8", SCALE_K=128, INT4_W=int4, ROW_GROUPS=act_order,
                 ACT_ORDER=act_order, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, EVEN_K=True,
                 HAS_BIAS=False, **dot_options(dtype))  # fmt: skip
    what = f"{t} {weight}{' act-order' if act_order else ''}{'' if gated else ' ungated'}"
    launch = dict(num_warps=fused_moe.INT4_WARPS if int4 else 4, num_stages=3)
    compiled = compile_kernel(
        fused_moe._gate_up_kernel,
        ptrs,
        dict(TOP_K=8, ACT=0 if gated else 4, GATED=gated, **tiles),
        **launch,
    )
    report(f"fused_moe gate_up {what}", compiled, allow_spills=not int4)
    compiled = compile_kernel(fused_moe._down_kernel, ptrs | {"out_ptr": "*fp32"}, tiles, **launch)
    report(f"fused_moe down {what}", compiled, allow_spills=not int4)


def compile_w4a16(
    dtype: torch.dtype, cfg: W4A16Config, split_k: int, *, act_order: bool = False,
    group_size: int = 128, even_k: bool = True, m: int | None = None, fp8: bool = False,
) -> None:  # fmt: skip
    """As a launch on contiguous tensors specialises it: unit strides are constants, pointers
    and the other strides (Llama's K and N are multiples of 16) divisible by 16, and M a
    constant when it is 1 (the JIT turns an int argument equal to 1 into a constexpr: a plain
    Python int in the kernel, which has no `.to`, as one decode token on a GPU found)."""
    t = TYPES[dtype]
    ptrs = {"x_ptr": f"*{t}", "out_ptr": f"*{t}", "scales_ptr": "*fp16", "zeros_ptr": "*u8"}
    ptrs |= {"qweight_ptr": "*i32", "g_idx_ptr": "*i32", "counters_ptr": "*i32"}
    ptrs |= {"partials_ptr": "*fp32"}
    row_groups = act_order or group_size % cfg.block_k != 0
    unit_strides = dict(stride_xk=1, stride_qn=1, stride_sn=1, stride_zn=1, stride_on=1)
    divisible = (*ptrs, "N", "K", "stride_xm", "stride_qk", "stride_sg", "stride_zg")
    if fp8:  # weight [N, K] FP8, scales fp32 [N, K blocks]: K and the blocks are contiguous
        ptrs |= {"qweight_ptr": "*fp8e4nv", "scales_ptr": "*fp32"}
        unit_strides = dict(stride_xk=1, stride_qk=1, stride_sg=1, stride_on=1)
        divisible = (*ptrs, "N", "K", "stride_xm", "stride_qn")
    compiled = compile_kernel(
        w4a16._w4a16_kernel, ptrs,
        dict(GROUP_SIZE=group_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
             BLOCK_K=cfg.block_k, SPLIT_K=split_k, GROUP_M=8, ROW_GROUPS=row_groups,
             ACT_ORDER=act_order, SCALE_AFTER_DOT=cfg.scale_after_dot and not row_groups,
             EVEN_K=even_k, FP8_WEIGHT=fp8, **unit_strides, **dot_options(dtype),
             **({"M": 1} if m == 1 else {})),
        (*divisible, "stride_om", "exponent"),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    what = f"split_k={split_k} act_order={act_order} group={group_size} even_k={even_k} m={m}"
    what += " fp8" if fp8 else ""
    # fp32 is a correctness path (FMA dots, not tensor cores); spills there cost nothing real.
    report(f"w4a16 {t} {cfg} {what}", compiled, allow_spills=dtype == torch.float32)


def compile_w4a16_defaults(dtype: torch.dtype, m: int, split_k: int, **kwargs) -> None:
    """The config w4a16_matmul picks for m tokens on a 4096-wide layer of an H100 (132 SMs)."""
    act_order = kwargs.get("act_order", False)
    cfg = default_config(m, 4096, kwargs.get("group_size", 128), dtype, 132, act_order)
    compile_w4a16(dtype, cfg, split_k, m=m, **kwargs)


def main() -> int:
    assert not interpreting(), "unset TRITON_INTERPRET: interpreted kernels cannot be compiled"
    # Every kernel and every compile-time branch once, not the whole dtype x head-dim product
    # (the interpreter tests cover that; compiling costs seconds per variant): bf16 at head dim
    # 128 (the common case) and 80 (padded, masked loads), the plain and split-K decode, the
    # sliding-window variants of both (soft-capped too, Gemma 2's: its sliding layers cap; with
    # gpt-oss's attention sinks beside, their branches all compiled in one variant). fp32
    # prefill (own tiles, ieee dots) takes ~15 s alone to compile: `--all` adds it.
    compile_prefill(torch.bfloat16, 128)
    compile_prefill(torch.bfloat16, 80, sliding=True, softcap=True, sinks=True)
    if "--all" in sys.argv:
        for dtype in (torch.float16, torch.float32):
            for head_dim in (64, 80, 96, 128):
                compile_prefill(dtype, head_dim)
                compile_decode(dtype, head_dim, splits=4)
    compile_decode(torch.bfloat16, 128, splits=1, sinks=True)
    compile_decode(torch.bfloat16, 80, splits=8, sliding=True, softcap=True)
    compile_decode(torch.bfloat16, 128, splits=8, per_sequence=True)  # CUDA graphs' decode
    compile_decode(torch.bfloat16, 80, splits=8, sliding=True, per_sequence=True)
    # Gemma 4's global layers' 512-dim heads, whose tiles are the configs' smallest
    compile_prefill(torch.bfloat16, 512, sliding=True)
    compile_decode(torch.bfloat16, 512, splits=8, per_sequence=True)
    # Llama 4's chunked layers
    compile_prefill(torch.bfloat16, 128, chunked=True)
    compile_decode(torch.bfloat16, 128, splits=8, per_sequence=True, chunked=True)
    # ALiBi's bias tiles (BLOOM's 128-dim heads, MPT's), prefill and graphed decode
    compile_prefill(torch.bfloat16, 128, alibi=True)
    compile_decode(torch.bfloat16, 128, splits=8, per_sequence=True, alibi=True)
    compile_reduce_and_kv_write(torch.bfloat16, 80)
    compile_elementwise(torch.bfloat16)
    compile_truncation_floor()
    # W4A16: decode (split-K epilogue) and prefill in bf16, act-order, a mid-size M with a
    # group of 32, K off the tile and fp16.
    compile_w4a16_defaults(torch.bfloat16, 1, split_k=8)
    compile_w4a16_defaults(torch.bfloat16, 4096, split_k=1)
    compile_w4a16_defaults(torch.float16, 256, split_k=2, act_order=True)
    compile_w4a16_defaults(torch.float16, 48, split_k=4, group_size=32, even_k=False)
    # FP8 weights: decode (scales after the dot) and prefill with 128-wide blocks, per channel
    # with a K that is not a tile multiple (a scale gathered per row)
    compile_w4a16_defaults(torch.bfloat16, 1, split_k=8, fp8=True)
    compile_w4a16_defaults(torch.bfloat16, 128, split_k=1, fp8=True)
    compile_w4a16_defaults(torch.float16, 16, split_k=2, group_size=200, even_k=False, fp8=True)
    if "--all" in sys.argv:
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for m in (1, 16, 64, 256, 4096):
                for act_order in (False, True):
                    compile_w4a16_defaults(dtype, m, split_k=1, act_order=act_order)
                    compile_w4a16_defaults(dtype, m, split_k=4, act_order=act_order)
                compile_w4a16_defaults(dtype, m, split_k=2, group_size=32, even_k=False)
    compile_fused_moe(torch.bfloat16, "dense")
    compile_fused_moe(torch.bfloat16, "fp8")
    compile_fused_moe(torch.bfloat16, "int4")
    compile_fused_moe(torch.bfloat16, "int4", act_order=True)
    compile_fused_moe(torch.bfloat16, "dense", gated=False)
    compile_lora(compile_kernel, report, everything="--all" in sys.argv)
    return 0


def report(what: str, compiled: tuple[int, tuple[int, int]], allow_spills: bool = True) -> None:
    shared, (regs, stack) = compiled
    print(f"compiled for sm_90: {what}: {shared} B shared, {regs} registers, {stack} B stack")
    sys.stdout.flush()
    if shared > H100_SHARED_BYTES:
        raise SystemExit(
            f"{what} needs {shared} B of shared memory; an H100 has {H100_SHARED_BYTES}"
        )
    if stack and not allow_spills:
        raise SystemExit(f"{what} spills registers ({stack} B of stack)")


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)  # too late to matter if set: the assert says so
    sys.exit(main())
