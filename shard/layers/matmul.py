"""The dense matmul behind every linear layer and the LM head.

On a CPU without native half-precision dot products (no AVX512-BF16/FP16 or AMX), torch's
bf16/fp16 GEMM runs several times slower than fp32 (bench/cpu_matmul.py: 11-20 vs 70-140
GFLOP/s on an AVX2 machine). There, for more than a few rows, the weight is widened to fp32 one
slice at a time for the duration of the call and the result rounded back. It computes the same
thing as a half-precision GEMM, which also multiplies exact products and accumulates in fp32;
only the summation order differs. Weights stay in their dtype, so memory is unchanged.
"""

from functools import cache

import torch
import torch.nn.functional as F

# Below this many rows the widening costs more than the faster GEMM saves (measured on 2 AVX2
# cores for weights from 576x576 to 49152x576).
WIDEN_MIN_ROWS = 4
# Output features widened at once: the fp32 slice stays cache-sized, which matters for the LM
# head (a 49152x576 weight widened whole is several times slower to convert).
WIDEN_CHUNK = 1024

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


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if weight.device.type != "cpu" or rows < WIDEN_MIN_ROWS or not _widen_on_cpu(weight.dtype):
        return F.linear(x, weight, bias)
    x32 = x.reshape(rows, x.shape[-1]).float()
    out = torch.empty(rows, weight.shape[0], dtype=x.dtype, device=x.device)
    for start in range(0, weight.shape[0], WIDEN_CHUNK):
        stop = start + WIDEN_CHUNK
        b = None if bias is None else bias[start:stop].float()
        out[:, start:stop] = F.linear(x32, weight[start:stop].float(), b)
    return out.reshape(*x.shape[:-1], weight.shape[0])
