"""When a layer's forward takes one of the native CPU kernels instead of its torch form: in eager
mode only (under --compile inductor fuses the torch form itself, and an opaque call would stop
it), on CPU tensors of a float dtype the kernels compute in, and where the kernels were built."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

F = TypeVar("F")

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def eager_cpu_kernel(kernel: Callable[[], F | None], x: torch.Tensor) -> F | None:
    """`kernel()` (an accessor of shard/platforms/cpu/native/build.py) where x may go through it,
    else None."""
    if torch.compiler.is_compiling() or x.device.type != "cpu" or x.dtype not in KERNEL_DTYPES:
        return None
    return kernel()


def heads_contiguous(x: torch.Tensor) -> bool:
    """x [T, H, D] with each row's heads contiguous (any row stride, e.g. a view into the fused
    qkv rows): the layout the native rotary and decode kernels read."""
    return x.dim() == 3 and x.stride(2) == 1 and (x.shape[1] <= 1 or x.stride(1) == x.shape[2])
