"""RMSNorm as Llama computes it: statistics in float32, scale applied in the model dtype."""

from __future__ import annotations

import torch
from torch import nn

from shard.weights import Weights


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    @classmethod
    def load(cls, weights: Weights, prefix: str, eps: float) -> RMSNorm:
        return cls(weights.get_tensor(f"{prefix}.weight"), eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        # Casting back before the scale matches the reference rounding in half precision.
        return self.weight * x32.to(dtype)
