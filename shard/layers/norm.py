"""RMSNorm as Llama computes it: statistics in float32, scale applied in the model dtype. On the CPU
in eager mode, one native pass (shard/native/elementwise.cpp) where torch takes six ops; on a GPU
one Triton kernel (shard/kernels/elementwise.py), the residual add included.

Given the residual stream too, the norm first adds it (`x + residual`, rounded to the dtype as
torch's add rounds) and returns both the normed sum and the sum, as vLLM's fused_add_rms_norm:
the decoder layer's residual adds then cost no call of their own (one native pass on the CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shard.native.build import add_rms_norm_kernel, rms_norm_kernel
from shard.native.eager import eager_cpu_kernel
from shard.weights import Weights


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    @classmethod
    def load(cls, weights: Weights, prefix: str, eps: float) -> RMSNorm:
        return cls(weights.get_tensor(f"{prefix}.weight"), eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x); with `residual`, (norm(x + residual), x + residual)."""
        if x.is_cuda and _rows(x) and (residual is None or _rows(residual)):
            from shard.kernels.elementwise import rms_norm  # one kernel where torch takes three

            out, summed = rms_norm(x, self.weight, self.eps, residual)
            return out if summed is None else (out, summed)
        if residual is None:
            return self._norm(x)
        kernel = eager_cpu_kernel(add_rms_norm_kernel, x)
        if (
            kernel is not None
            and x.dim() == 2
            and x.shape == residual.shape
            and x.stride(-1) == 1
            and residual.stride(-1) == 1
            and x.dtype == residual.dtype == self.weight.dtype
        ):
            return kernel(x, residual, self.weight, self.eps)
        summed = x + residual
        return self._norm(summed), summed

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        kernel = eager_cpu_kernel(rms_norm_kernel, x)
        if (
            kernel is not None
            and x.dim() in (2, 3)
            and x.stride(-1) == 1
            and self.weight.dtype == x.dtype
        ):
            return kernel(x, self.weight, self.eps)
        # torch's fused kernel computes x * rsqrt(mean(x^2) + eps) in float32 and rounds once
        # to x's dtype, as Llama does before the scale (tests/shard/test_rmsnorm_rotary.py
        # checks it bit for bit); one op for what took six, 61 times a step.
        normed = F.rms_norm(x, (x.shape[-1],), eps=self.eps)
        # Scaling after the rounding matches the reference rounding in half precision.
        return self.weight * normed


def _rows(x: torch.Tensor) -> bool:
    """Whether x is [T, N] with unit-stride rows, as the Triton kernel takes it."""
    return x.dim() == 2 and x.stride(-1) == 1
