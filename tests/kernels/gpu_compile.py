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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from shard.kernels import (  # noqa: E402
    decode,
    decode_reduce,
    dot_options,
    head_block,
    interpreting,
    kv_write,
    prefill,
)

HOPPER = GPUTarget("cuda", 90, 32)
H100_SHARED_BYTES = 227 * 1024
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def compile_kernel(fn, pointers: dict[str, str], constexprs: dict, **options) -> int:
    """Compiles `fn` with the named pointer/float args typed, other args i32 (strides, lengths);
    returns the shared memory it needs."""
    signature = {
        name: "constexpr" if name in constexprs else pointers.get(name, "i32")
        for name in fn.arg_names
    }
    kernel = triton.compile(ASTSource(fn, signature, constexprs), target=HOPPER, options=options)
    return kernel.metadata.shared


def compile_prefill(dtype: torch.dtype, head_dim: int, sliding: bool = False) -> None:
    t = TYPES[dtype]
    cfg = prefill.default_prefill_config(head_dim, dtype)
    ptrs = {n: f"*{t}" for n in ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "cache_ptr")}
    ptrs |= {n: "*i32" for n in ("block_tables_ptr", "context_lens_ptr")}
    ptrs |= {"cu_seqlens_q_ptr": "*i32", "cu_seqlens_k_ptr": "*i32", "scale_log2": "fp32"}
    ptrs["stride_c_kv"] = "i64"  # a large cache's K-to-V distance passes 2^31 elements
    shared = compile_kernel(
        prefill._prefill_kernel, ptrs,
        dict(GROUP=4, HEAD_DIM=head_dim, BLOCK_D=head_block(head_dim), BLOCK_M=cfg.block_m,
             BLOCK_N=cfg.block_n, CACHE_BLOCK_SIZE=16, HAS_PREFIX=True, SLIDING=sliding,
             **dot_options(dtype)),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    report(f"prefill {t} d{head_dim} sliding={sliding} {cfg}", shared)


def compile_decode(dtype: torch.dtype, head_dim: int, splits: int, sliding: bool = False) -> None:
    t = TYPES[dtype]
    cfg = decode.default_decode_config()
    ptrs = {n: f"*{t}" for n in ("q_ptr", "cache_ptr", "out_ptr")}
    ptrs |= {"block_tables_ptr": "*i32", "context_lens_ptr": "*i32", "scale_log2": "fp32"}
    ptrs |= {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "stride_c_kv": "i64"}
    shared = compile_kernel(
        decode._paged_decode_kernel, ptrs,
        dict(NUM_HEADS=32, GROUP=4, BLOCK_G=16, HEAD_DIM=head_dim, BLOCK_D=head_block(head_dim),
             BLOCK_N=cfg.block_n, CACHE_BLOCK_SIZE=16, NUM_SPLITS=splits, SLIDING=sliding,
             **dot_options(dtype)),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    report(f"decode {t} d{head_dim} splits={splits} sliding={sliding} {cfg}", shared)


def compile_reduce_and_kv_write(dtype: torch.dtype, head_dim: int) -> None:
    t = TYPES[dtype]
    shared = compile_kernel(
        decode_reduce._decode_reduce_kernel,
        {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": f"*{t}"},
        dict(NUM_HEADS=32, NUM_SPLITS=8, BLOCK_S=8, HEAD_DIM=head_dim,
             BLOCK_D=triton.next_power_of_2(head_dim)),
    )  # fmt: skip
    report(f"decode_reduce {t} d{head_dim}", shared)
    shared = compile_kernel(
        kv_write._kv_write_kernel,
        {"key_ptr": f"*{t}", "value_ptr": f"*{t}", "cache_ptr": f"*{t}", "slot_ptr": "*i64",
         "stride_c_kv": "i64"},
        dict(BLOCK_SIZE=16, NUM_KV_HEADS=8, HEAD_DIM=head_dim, BLOCK_H=8,
             BLOCK_D=head_block(head_dim)),
    )  # fmt: skip
    report(f"kv_write {t} d{head_dim}", shared)


def main() -> int:
    assert not interpreting(), "unset TRITON_INTERPRET: interpreted kernels cannot be compiled"
    # Every kernel and every compile-time branch once, not the whole dtype x head-dim product
    # (the interpreter tests cover that; compiling costs seconds per variant): bf16 at head dim
    # 128 (the common case) and 80 (padded, masked loads), the plain and split-K decode, the
    # sliding-window variants of both. fp32
    # prefill (own tiles, ieee dots) takes ~15 s alone to compile: `--all` adds it.
    compile_prefill(torch.bfloat16, 128)
    compile_prefill(torch.bfloat16, 80, sliding=True)
    if "--all" in sys.argv:
        for dtype in (torch.float16, torch.float32):
            for head_dim in (64, 80, 96, 128):
                compile_prefill(dtype, head_dim)
                compile_decode(dtype, head_dim, splits=4)
    compile_decode(torch.bfloat16, 128, splits=1)
    compile_decode(torch.bfloat16, 80, splits=8, sliding=True)
    compile_reduce_and_kv_write(torch.bfloat16, 80)
    return 0


def report(what: str, shared: int) -> None:
    print(f"compiled for sm_90: {what}: {shared} B shared", flush=True)
    if shared > H100_SHARED_BYTES:
        raise SystemExit(
            f"{what} needs {shared} B of shared memory; an H100 has {H100_SHARED_BYTES}"
        )


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)  # too late to matter if set: the assert says so
    sys.exit(main())
