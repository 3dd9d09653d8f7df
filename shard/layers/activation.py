"""SwiGLU's gated activation, silu(gate) * up (Llama's MLP): on the CPU in eager mode one native
pass (shard/native/elementwise.cpp) instead of two ops and a temporary; on a GPU one Triton
kernel (shard/kernels/elementwise.py) for the fused gate_up product."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shard.native.build import silu_mul_kernel
from shard.native.eager import eager_cpu_kernel


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [T, I] (e.g. the two halves of the gate_up product) -> silu(gate) * up."""
    kernel = eager_cpu_kernel(silu_mul_kernel, gate)
    if (
        kernel is not None
        and gate.dim() == 2
        and gate.shape == up.shape
        and gate.dtype == up.dtype
        and gate.stride(1) == 1
        and up.stride(1) == 1
    ):
        return kernel(gate, up)
    return F.silu(gate) * up


def swiglu(product: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused gate_up product [T, 2I], its first half of outputs the gate's
    (each tensor-parallel rank's product is laid out so too)."""
    if product.is_cuda and product.dim() == 2 and product.stride(-1) == 1:
        from shard.kernels.elementwise import silu_mul  # one kernel where torch takes two

        return silu_mul(product)
    gate, up = product.chunk(2, dim=-1)
    return silu_and_mul(gate, up)
