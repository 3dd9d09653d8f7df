"""Mistral Large 4's per-head query scaling by position ("ssmax"): each head's query times
s_h * log(p + 1) + b_h at position p, with s and b learned per head, so a head may sharpen its
softmax as the context grows. Computed in the query's dtype, as transformers computes it."""

from __future__ import annotations

import torch
from torch import nn

from shard.weights import Weights


class HeadPositionScale(nn.Module):
    def __init__(self, scale: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale, persistent=False)  # [heads]
        self.register_buffer("bias", bias, persistent=False)

    @classmethod
    def load(
        cls, weights: Weights, prefix: str, first: int = 0, last: int | None = None
    ) -> HeadPositionScale:
        """Heads [first, last) (all: None) of the checkpoint's `prefix.s` and `prefix.b`."""

        def part(name: str) -> torch.Tensor:
            tensor = weights.get_tensor(f"{prefix}.{name}", stored_dtype=True)
            return tensor[first:last].float()

        return cls(part("s"), part("b"))

    def factor(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[T, heads, 1] each token's factor per head, in `dtype`."""
        log_pos = (positions + 1).float().log().to(dtype)
        factor = self.scale.to(dtype)[None, :] * log_pos[:, None] + self.bias.to(dtype)[None, :]
        return factor.unsqueeze(-1)

    def forward(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """q [T, heads, D] at `positions` [T] -> each head's query times its factor."""
        return q * self.factor(positions, q.dtype)
