"""The dense matmul behind every linear layer and the LM head.

On a CPU without native half-precision dot products (no AVX512-BF16/FP16 or AMX), torch's
bf16/fp16 GEMM runs several times slower than fp32 (bench/cpu_matmul.py: 11-20 vs 70-140
GFLOP/s on an AVX2 machine), and its cost grows with the rows even at a decode step's few. There,
up to ROWS_KERNEL_MAX rows, the native rows kernel (native/rows_gemm.cpp, AVX2) reads each
weight row once for all rows: 1.3-1.8x torch at one row, 3.5-5x at 4-8 (the SmolLM2 shapes on 2
EPYC cores), and each row's result independent of the rows beside it, so a decode or verify step
of several rows gives each the ids it gets alone. Beyond, or without the kernel, for more than a
few rows the weight is widened to fp32 one slice at a time for the duration of the call and the
result rounded back. It computes the same
thing as a half-precision GEMM, which also multiplies exact products and accumulates in fp32;
only the summation order differs. Weights stay in their dtype, so memory is unchanged.

Where the CPU has the AMX tile unit, bf16 weights are packed once at load for the native tile
kernel instead (shard/platforms/cpu/matmul_amx.py: a decode step's GEMMs ~1.5x faster than
oneDNN's). Elsewhere, where the CPU does have native GEMM for the dtype (fp32 everywhere; bf16 with
AVX512-BF16), weights are packed once at load into oneDNN's blocked layout (`prepare_weight`).
Unpacked, oneDNN re-lays a bf16 weight out on every call, which costs more than the product
itself when the weight comes from DRAM, as every weight of a decode step does
(bench/cpu_matmul.py, "packed" column: 1.4-1.6x at 1-16 rows in bf16, 2.4x in fp32). Packing
reorders; it computes the same sums (bf16 results are bit-identical here).
"""

from functools import cache

import torch
import torch.nn.functional as F

from shard.platforms.cpu import matmul_amx
from shard.platforms.cpu.native import build as native

# Below this many rows the widening costs more than the faster GEMM saves (measured on 2 AVX2
# cores for weights from 576x576 to 49152x576).
WIDEN_MIN_ROWS = 4
# Up to this many rows the rows kernel runs where it can (at 32 it still matched the widening
# path on the SmolLM2 MLP's down projection, and beat it elsewhere).
ROWS_KERNEL_MAX = 32
# Output features widened at once: the fp32 slice stays cache-sized, which matters for the LM
# head (a 49152x576 weight widened whole is several times slower to convert).
WIDEN_CHUNK = 1024
# Rows oneDNN is told to expect when it picks the packed layout; the layout serves any row
# count (measured: hints 16 and 64 time alike from 1 to 256 rows, 1 is slower past 16 rows).
PACK_ROWS_HINT = 16

_NATIVE_FLAGS = {
    torch.bfloat16: ("avx512_bf16", "amx_bf16"),
    torch.float16: ("avx512_fp16", "amx_fp16"),
}


@cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _widen_on_cpu(dtype: torch.dtype) -> bool:
    native = _NATIVE_FLAGS.get(dtype)
    return native is not None and not any(flag in _cpu_flags() for flag in native)


def prepare_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] in the layout `linear` multiplies fastest: packed for the AMX kernel
    or for oneDNN on a CPU with native GEMM for its dtype, else unchanged. `dense` reads a
    packed weight back; it is a new tensor, so a weight shared with an embedding stays unpacked
    there."""
    if matmul_amx.can_pack(weight):
        return matmul_amx.pack(weight)
    if (
        weight.device.type != "cpu"
        or weight.dim() != 2
        or weight.dtype not in (torch.float32, torch.bfloat16, torch.float16)
        or not torch.backends.mkldnn.is_available()
        or _widen_on_cpu(weight.dtype)
    ):
        return weight
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS_HINT)
    except RuntimeError:  # oneDNN refuses the dtype on this CPU (fp16 needs AVX512-FP16)
        return weight


def dense(weight: torch.Tensor) -> torch.Tensor:
    """The plain [out, in] tensor behind a weight `prepare_weight` returned."""
    if matmul_amx.is_packed(weight):
        return matmul_amx.unpack(weight)
    return weight.to_dense() if weight.is_mkldnn else weight


def is_packed(weight: torch.Tensor) -> bool:
    """Whether `weight` is in a layout `prepare_weight` made (not a plain [out, in] tensor)."""
    return weight.is_mkldnn or matmul_amx.is_packed(weight)


def swiglu_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor | None:
    """A Mixture-of-Experts layer's SwiGLU experts and each token's weighted sum in one native
    call (rows_moe.cpp), where every expert's rows are few enough for the rows kernel: what
    shard/platforms/grouped_moe.py computes with `linear` and silu_and_mul expert by expert,
    without its sort, gather, index_add and dozen dispatched ops per expert. None where it does
    not apply."""
    if (
        torch.compiler.is_compiling()
        or x.device.type != "cpu"
        or not x.dtype == w13.dtype == w2.dtype
        or not _widen_on_cpu(x.dtype)
        or w13.stride(-1) != 1
        or w2.stride(-1) != 1
    ):
        return None
    kernel = native.rows_moe_kernel()
    if kernel is None:
        return None
    ids = topk_ids.to(torch.int32)
    return kernel(x, ids, topk_weights.float(), w13, w2, ROWS_KERNEL_MAX)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if torch.compiler.is_compiling():
        # torch.compile (shard/platforms/cpu/compiled.py) packs plain weights itself; the CPU checks
        # below cannot be traced (a cached /proc read).
        return F.linear(x, weight, bias)
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    if matmul_amx.is_packed(weight):
        return matmul_amx.linear(x, weight, bias)
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if weight.device.type != "cpu" or not _widen_on_cpu(weight.dtype):
        return F.linear(x, weight, bias)
    if 0 < rows <= ROWS_KERNEL_MAX and weight.stride(-1) == 1:
        kernel = native.rows_linear_kernel()
        if kernel is not None:
            out = kernel(x.reshape(rows, x.shape[-1]), weight, bias)
            return out.reshape(*x.shape[:-1], weight.shape[0])
    if rows < WIDEN_MIN_ROWS:
        return F.linear(x, weight, bias)
    x32 = x.reshape(rows, x.shape[-1]).float()
    out = torch.empty(rows, weight.shape[0], dtype=x.dtype, device=x.device)
    for start in range(0, weight.shape[0], WIDEN_CHUNK):
        stop = start + WIDEN_CHUNK
        b = None if bias is None else bias[start:stop].float()
        out[:, start:stop] = F.linear(x32, weight[start:stop].float(), b)
    return out.reshape(*x.shape[:-1], weight.shape[0])
