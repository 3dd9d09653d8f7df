"""The scales of FP8 Mixture-of-Experts experts as the fused MoE kernel takes them
(shard/platforms/cuda/kernels/fused_moe.py), made by shard/layers/moe_fp8.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fp8Scales:
    """`scales` float32 [E, rows, ceil(K / block_k)] for a weight [E, rows, K]: weight[e, n, k]
    is scaled by scales[e, n, k // block_k]."""

    scales: torch.Tensor
    block_k: int
