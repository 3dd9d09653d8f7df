"""The shard's native CPU kernels, one extension built on first use with torch's C++ extension
builder from vector.h (shared loads and stores) and each kernel's source:
- paged_decode.cpp: the torch attention backend's paged decode attention, and the write of a
  step's new K/V rows into their cache slots. In torch, a CPU decode step's attention is a gather
  of every row's K/V into a padded copy, then SDPA over the copy; the gather alone moves the
  cache's bytes twice, and the index and mask plumbing is a few dozen small torch calls a layer.
  The kernel reads the cache in place through the block table, once (bench/decode_attention.py).
- attention_avx2.cpp: the two attention kernels' arithmetic in AVX2 for x86-64 CPUs without
  AVX-512 (the build's target otherwise leaves them scalar loops).
- paged_prefill.cpp: the same backend's prefill attention for short prompts and chunks, every
  sequence of a step in one call per layer (the torch path calls SDPA once per sequence).
- lora.cpp: the LoRA terms of a linear at a decode step's size, all slots in one call
  (shard/layers/lora.py; bench/profile_lora.py).
- elementwise.cpp: RMSNorm (alone or after the residual add), SiLU-and-mul and the rotary
  embedding, one pass each, for the eager
  path (shard/layers/norm.py, activation.py, rotary.py): in torch they are a dozen ops a layer,
  with fp32 temporaries.
- argmax.cpp: the sampler's greedy choice, torch.argmax over each row of scores (torch's CPU
  argmax is several times slower over a vocabulary).
- amx_gemm.cpp: bf16 linear layers on the AMX tile unit, where the CPU has one
  (shard/platforms/cpu/matmul_amx.py): at a decode step's few rows oneDNN reads the weights at well
  under the memory's bandwidth.
- amx_lora.cpp: such a linear and its LoRA terms in one call (shard/platforms/cpu/lora_amx.py): the
  shrink as a small tile product, the expand as more of the base product's K.
- paged_prefill_amx.cpp: paged_prefill.cpp's attention in bf16 with its two products on the
  tile unit.
- rows_gemm.cpp: bf16/fp16 linear layers of a few rows on a CPU with AVX2 but no half-precision
  dot products (shard/platforms/cpu/matmul.py), where torch's GEMM costs grow with the rows:
  each weight read once for all rows, each row's sums the same whatever rows are beside it.
- rows_moe.cpp: a Mixture-of-Experts layer's SwiGLU experts over a decode step's rows and each
  token's weighted sum in one call, with rows_gemm.cpp's kernel.

The build needs a C++ compiler and ninja, takes 30-90 s of one core once per machine and torch
version, and is cached by torch (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions);
`make install` runs it (`python -m shard.platforms.cpu.native`), so that a first shard
start does not spend its readiness time compiling. Where it cannot be
built, or with SWITCHYARD_CPU_KERNELS=0, each caller keeps its torch path, which computes the same
(accumulating in fp32 too), and the shard's log says which one runs and why.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

# Compiled as one translation unit, in this order (the shared part first).
SOURCES = [
    Path(__file__).with_name(n)
    for n in (
        "vector.h",
        "attention_avx2.cpp",
        "paged_decode.cpp",
        "paged_prefill.cpp",
        "lora.cpp",
        "elementwise.cpp",
        "argmax.cpp",
        "amx_gemm.cpp",
        "amx_lora.cpp",
        "paged_prefill_amx.cpp",
        "rows_gemm.cpp",
        "rows_moe.cpp",
    )
]
FUNCTIONS = [
    "attention_path",
    "paged_decode",
    "paged_prefill",
    "store_kv",
    "lora_apply",
    "rms_norm",
    "add_rms_norm",
    "silu_mul",
    "rotary",
    "argmax_rows",
    "amx_ready",
    "amx_linear",
    "amx_linear_silu_mul",
    "amx_lora_linear",
    "amx_paged_prefill",
    "rows_linear",
    "rows_moe",
]
SWITCH_ENV = "SWITCHYARD_CPU_KERNELS"  # "0": the torch path only
# "0": build without the CPU's bf16 dot products even where it has them (how the tests reach the
# widening path that CPUs without them run).
BF16_DOTS_ENV = "SWITCHYARD_CPU_BF16_DOTS"
# What the AVX-512 path uses (F: arithmetic, scalef, roundscale; BW/VL: the 16-bit loads).
_AVX512_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"]
# "0": dense bf16 linears keep oneDNN even where the AMX kernel runs (to compare the two).
AMX_ENV = "SWITCHYARD_CPU_AMX"
# "0": no AVX2 paths (the rows kernels, the attention kernels' 8-lane arithmetic), read at the
# first call in a process, no rebuild: how the tests reach what CPUs without AVX2 run.
AVX2_ENV = "SWITCHYARD_CPU_AVX2"
# The tile unit (amx_gemm.cpp), where the CPU has it; a compiler that does not know the flags
# gets a build without them (the tile kernel then reports itself not ready).
_AMX_FLAGS = ["-mamx-tile", "-mamx-bf16"]


def unavailable_reason() -> str | None:
    """Why the kernels cannot be built here, or None when they can be."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return f"{SWITCH_ENV}=0"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) on PATH"
    from torch.utils.cpp_extension import verify_ninja_availability

    try:
        verify_ninja_availability()
    except RuntimeError:
        return "ninja is not installed"
    return None


def paged_decode_kernel() -> Callable[..., torch.Tensor] | None:
    """paged_decode(q [B, H, D], k_cache, v_cache [blocks, block_size, Hkv, D], block_tables
    [B, max_blocks] int32, context_lens [B] int32, scale, window (0: none), softcap (0: none;
    else each scaled score s becomes softcap * tanh(s / softcap), Gemma 2), sinks (None or [H]
    float32, gpt-oss), alibi (None or [H] float32 slopes: ALiBi, BLOOM, MPT)) -> [B, H, D], all
    in one dtype (fp32, bf16, fp16); None where it cannot be built (logged once)."""
    return _function("paged_decode")


def attention_path() -> str | None:
    """The arithmetic the attention kernels run here ("avx512", "avx2" or "scalar"); None where
    the kernels cannot be built."""
    function = _function("attention_path")
    return None if function is None else function()


def paged_prefill_kernel() -> Callable[..., None] | None:
    """paged_prefill(q [T, H, D], k_cache, v_cache, block_tables [B, max_blocks] int32,
    context_lens [B] int32, cu_seqlens_q [B + 1] int32, seqs (sequence indices), out [T, H, D],
    scale, window (0: none), softcap (0: none; as paged_decode's)): causal attention of the
    listed sequences' query tokens over their cached K/V, written into out's rows (the contract
    is paged_prefill.cpp's); None where the kernels cannot be built."""
    return _function("paged_prefill")


def store_kv_kernel() -> Callable[..., None] | None:
    """store_kv(key, value [T, Hkv, D], kv_cache [2, blocks, block_size, Hkv, D], slot_mapping
    [T]): each token's K and V rows into its slot, all in the cache's dtype; None where the
    kernels cannot be built."""
    return _function("store_kv")


def lora_kernel() -> Callable[..., None] | None:
    """lora_apply(x [T, K], y [T, N], a, b, order, segments, scaling, rank, out_slices): adds
    each token's LoRA term into y in place (the contract is lora.cpp's); None where the kernels
    cannot be built."""
    return _function("lora_apply")


def rms_norm_kernel() -> Callable[..., torch.Tensor] | None:
    """rms_norm(x [R, n] or [A, B, n] with contiguous rows, weight [n], eps) -> a new [.., n],
    one dtype; None where the kernels cannot be built."""
    return _function("rms_norm")


def add_rms_norm_kernel() -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    """add_rms_norm(x, residual [R, n] with contiguous rows, weight [n], eps) -> (rms_norm(s), s)
    with s = x + residual, new tensors, one dtype; None where the kernels cannot be built."""
    return _function("add_rms_norm")


def silu_mul_kernel() -> Callable[..., torch.Tensor] | None:
    """silu_mul(gate, up [R, n] with contiguous rows) -> silu(gate) * up, a new [R, n]; None where
    the kernels cannot be built."""
    return _function("silu_mul")


def rotary_kernel() -> Callable[..., torch.Tensor] | None:
    """rotary(x [T, H, D] with each row's heads contiguous, cos and sin [P, R] float32 (R even,
    <= D: the leading dims that rotate, the rest copied), positions [T] int64 (table rows)) ->
    the rotated x, a new [T, H, D]; None where the kernels cannot be built."""
    return _function("rotary")


def argmax_kernel() -> Callable[..., torch.Tensor] | None:
    """argmax_rows(scores [R, V] float32 with contiguous rows) -> [R] int64, torch.argmax's
    choice (first maximum, NaN above all); None where the kernels cannot be built."""
    return _function("argmax_rows")


def amx_linear_kernel() -> Callable[..., torch.Tensor] | None:
    """amx_linear(x [M, K] bf16, packed [N/16, K/32, 16, 16, 2] bf16, bias [N] | None) -> [M, N]
    (the layout is shard/platforms/cpu/matmul_amx.py's); None where the CPU has no AMX-BF16, the OS
    does not lend the tiles, the kernels cannot be built, or SWITCHYARD_CPU_AMX=0."""
    if os.environ.get(AMX_ENV, "1") == "0":
        return None
    return _amx_linear()


def amx_linear_silu_mul_kernel() -> Callable[..., torch.Tensor] | None:
    """amx_linear_silu_mul(x, packed, bias) -> silu(gate) * up [M, N/2] for a packed fused
    gate_up weight (gate outputs, then up); None wherever amx_linear_kernel() is."""
    if amx_linear_kernel() is None:
        return None
    return _function("amx_linear_silu_mul")


def amx_lora_linear_kernel() -> Callable[..., torch.Tensor] | None:
    """amx_lora_linear(x, packed, bias, gated, a_tiles, b_tiles, token_slots, scaling, rank,
    out_slices): a packed bf16 linear (SwiGLU'd if gated) plus each token's LoRA term, rounded
    once (the contract is amx_lora.cpp's); None wherever amx_linear_kernel() is."""
    if amx_linear_kernel() is None:
        return None
    return _function("amx_lora_linear")


@functools.cache
def rows_linear_kernel() -> Callable[..., torch.Tensor] | None:
    """rows_linear(x [M, K], w [N, K] bf16/fp16 with contiguous rows, bias [N] | None) -> [M, N]
    in x's dtype (rows_gemm.cpp); None where the CPU lacks AVX2, FMA or F16C or the kernels cannot
    be built."""
    if not {"avx2", "fma", "f16c"} <= _cpu_flags() or os.environ.get(AVX2_ENV, "1") == "0":
        return None
    return _function("rows_linear")


@functools.cache
def rows_moe_kernel() -> Callable[..., torch.Tensor | None] | None:
    """rows_moe(x [T, H], topk_ids [T, K] int32, topk_weights [T, K] float32, w13 [E, 2I, H],
    w2 [E, H, I], max_rows) -> [T, H] | None: a Mixture-of-Experts layer's SwiGLU experts and
    each token's weighted sum in one call, all in x's dtype, bf16 or fp16 (rows_moe.cpp); None
    from the call where an expert has more than max_rows rows. None wherever
    rows_linear_kernel() is."""
    if rows_linear_kernel() is None:
        return None
    return _function("rows_moe")


def amx_paged_prefill_kernel() -> Callable[..., None] | None:
    """amx_paged_prefill: paged_prefill's contract for bf16 q and caches with an even head size,
    on the AMX tile unit (paged_prefill_amx.cpp); None wherever amx_linear_kernel() is."""
    if amx_linear_kernel() is None:
        return None
    return _function("amx_paged_prefill")


@functools.cache
def _amx_linear() -> Callable[..., torch.Tensor] | None:
    module = _module()
    return module.amx_linear if module is not None and module.amx_ready() else None


def _function(name: str) -> Callable[..., Any] | None:
    module = _module()
    return None if module is None else getattr(module, name)


def has_bf16_dots() -> bool:
    """Whether the build uses the CPU's bf16 dot products (AVX512-BF16)."""
    return "avx512_bf16" in _cpu_flags() and os.environ.get(BF16_DOTS_ENV, "1") != "0"


def _cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere: no optional ISA then)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@functools.cache
def _module():  # -> the built extension, or None (logged once)
    reason = unavailable_reason()
    if reason is not None:
        log.info("native CPU kernels: none, torch paths (%s)", reason)
        return None
    capability = torch.backends.cpu.get_cpu_capability()  # what torch's own kernels run here
    # OpenMP: at::parallel_for spreads rows over torch's threads. No contraction of a product and a
    # sum into one FMA unless a kernel asks for it: where torch rounds a product before adding
    # it (rotary in fp32), the kernels must too.
    flags = ["-O3", "-fopenmp", "-ffp-contract=off"]
    isa = capability.lower()
    if capability.startswith("AVX512"):
        flags += _AVX512_FLAGS
        if has_bf16_dots():  # the LoRA kernel's shrink
            flags.append("-mavx512bf16")
            isa += "_bf16"
        if {"amx_tile", "amx_bf16"} <= _cpu_flags():
            module = _build(isa + "_amx", [*flags, *_AMX_FLAGS], capability, amx_attempt=True)
            if module is not None:
                return module
    return _build(isa, flags, capability)


def _build(isa: str, flags: list[str], capability: str, amx_attempt: bool = False):  # -> or None
    """The extension built with `flags`; None (logged) where it fails. A failed AMX attempt is only
    noted: the caller then builds without the tile kernel."""
    source = "\n".join(path.read_text() for path in SOURCES)
    # The ISA in the name, torch's version in the digest: a cache directory shared by machines
    # of different CPUs, or kept across a torch upgrade, never hands a shard a build it cannot
    # run (torch's own rebuild check hashes only the sources and flags). Torch's install
    # directory too: two environments sharing the cache (two venvs, a checkout and its CI clone)
    # would otherwise rewrite each other's build file (its include paths) and rebuild in turn.
    key = " ".join([source, *flags, torch.__version__, str(Path(torch.__file__).parent)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    name = f"switchyard_cpu_kernels_{isa}_{digest}"
    try:
        from torch.utils.cpp_extension import load_inline

        module = load_inline(name, cpp_sources=[source], functions=FUNCTIONS, extra_cflags=flags)
    except Exception as err:  # a broken toolchain costs speed, never the shard
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if amx_attempt:
            log.info("native CPU kernels: no AMX build (%s); building without it", first)
        else:
            log.warning("native CPU kernels: none, torch paths (the build failed: %s)", first)
        return None
    log.info(
        "native CPU kernels: paged decode attention, K/V write, LoRA, RMSNorm, SiLU-and-mul, "
        "rotary, argmax%s (%s; attention arithmetic: %s)",
        ", AMX linear" if module.amx_ready() else "",
        capability,
        module.attention_path(),
    )
    return module


def main() -> int:
    """Builds this CPU's extension now (or finds it cached) and says which kernels it has. Exit
    status 0 either way: a machine that cannot build it still serves, on the torch paths."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    _module()
    return 0
