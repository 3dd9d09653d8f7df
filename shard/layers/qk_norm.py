"""The norms of q and k between the qkv projection and rotary, called as one: (q, k) -> (q, k).

- `HeadQKNorm` (Qwen3, Gemma 3, EXAONE 4): each head's q and k normed over head_dim by the
  model's norm kind, or by `PerHeadLayerNorm`s, whose weights differ by head (StableLM's).
- `ProjectionQKNorm` (OLMo 2 and 3): q and k each normed over the whole projection, every
  head's dims at once. Under tensor parallelism a rank holds some of the heads, so the mean of
  squares needs every rank's part: each rank sums its own squares, q's and k's side by side, and
  one all-reduce a layer adds them. Every rank holds the same number of columns, and KV heads
  shared by several ranks are shared evenly (`head_range`), so the sum over ranks divided by
  world_size x the local width is the mean over the whole projection, replicated heads counted
  alike in both. With one rank it is transformers' mean exactly. Normed in float32; the weight
  applied in float32 and the product rounded once (OLMo's Olmo2RMSNorm, the model's "fp32_rms"
  norm), or applied in the model's dtype after the normed values are rounded (MiniMax-M2's
  plain RMSNorm, "rms").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shard.distributed import Distributed
from shard.layers.linear import head_range
from shard.weights import Weights


class HeadQKNorm(nn.Module):
    def __init__(self, q_norm: nn.Module, k_norm: nn.Module | None) -> None:
        """`k_norm` None: a layer that reads another layer's normed keys (Gemma 4's KV
        sharing), which calls `q_norm` alone."""
        super().__init__()
        self.q_norm, self.k_norm = q_norm, k_norm

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.k_norm is not None, "a layer without keys of its own norms its queries alone"
        return self.q_norm(q), self.k_norm(k)


class ProjectionQKNorm(nn.Module):
    def __init__(
        self, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, dist: Distributed
    ) -> None:
        super().__init__()
        # this rank's columns: [local heads x head_dim], [local KV heads x head_dim]; float32:
        # applied before the rounding to the model's dtype, else after it
        self.q_weight = nn.Parameter(q_weight, requires_grad=False)
        self.k_weight = nn.Parameter(k_weight, requires_grad=False)
        self.eps = eps
        self.dist = dist

    @classmethod
    def load(
        cls,
        weights: Weights,
        q_prefix: str,
        k_prefix: str,
        eps: float,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        weight_in_float32: bool = True,
    ) -> ProjectionQKNorm:
        """This rank's columns of both norms: its query heads', and its KV heads' (shared
        where there are fewer than ranks, as the qkv projection shares them)."""
        dist = weights.dist

        def columns(prefix: str, heads: int, kv: bool) -> torch.Tensor:
            name = f"{prefix}.weight"
            first, last = head_range(heads, dist.rank, dist.world_size, replicate=kv, tensor=name)
            weight = weights.get_range(name, 0, first * head_dim, last * head_dim)
            return weight.float() if weight_in_float32 else weight

        return cls(
            columns(q_prefix, num_heads, False), columns(k_prefix, num_kv_heads, True), eps, dist
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, heads, D], k [T, KV heads, D] (this rank's) -> both normed, in their dtype."""
        tokens = q.shape[0]
        q32, k32 = q.reshape(tokens, -1).float(), k.reshape(tokens, -1).float()
        if self.dist.world_size == 1:
            q_mean = q32.pow(2).mean(-1, keepdim=True)
            k_mean = k32.pow(2).mean(-1, keepdim=True)
        else:
            sums = torch.stack((q32.pow(2).sum(-1), k32.pow(2).sum(-1)), dim=1)
            sums = self.dist.all_reduce(sums) / self.dist.world_size
            q_mean, k_mean = sums[:, :1] / q32.shape[1], sums[:, 1:] / k32.shape[1]
        q_out = self._weighted(self.q_weight, q32 * torch.rsqrt(q_mean + self.eps), q.dtype)
        k_out = self._weighted(self.k_weight, k32 * torch.rsqrt(k_mean + self.eps), k.dtype)
        return q_out.view(q.shape), k_out.view(k.shape)

    @staticmethod
    def _weighted(weight: torch.Tensor, normed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if weight.dtype == torch.float32:
            return (weight * normed).to(dtype)
        return weight * normed.to(dtype)


class PerHeadLayerNorm(nn.Module):
    """A LayerNorm over head_dim, without bias, whose weight is each head's own (StableLM's
    qk_layernorm: `q_layernorm.norms.{h}`, one nn.LayerNorm a head), for this rank's heads:
    their weights stacked [heads, D] in float32. Normed and scaled in float32 and rounded once,
    as torch's layer_norm computes a half-precision input inside its kernel."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    @classmethod
    def load(
        cls, weights: Weights, prefix: str, num_heads: int, eps: float, *, kv: bool
    ) -> PerHeadLayerNorm:
        """This rank's heads' norms (`kv`: KV heads, shared where there are fewer than ranks, as
        the qkv projection shares them); the other ranks' are theirs to read."""
        dist = weights.dist
        name = f"{prefix}.norms.{{h}}.weight"
        first, last = head_range(num_heads, dist.rank, dist.world_size, replicate=kv, tensor=name)
        for h in [*range(first), *range(last, num_heads)]:
            weights.mark_consumed(name.format(h=h))
        rows = [weights.get_tensor(name.format(h=h)).float() for h in range(first, last)]
        return cls(torch.stack(rows), eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D] -> normed, in its dtype."""
        normed = F.layer_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (normed * self.weight).to(x.dtype)
