"""The CUDA platform: the Triton kernels (shard/platforms/cuda/kernels/), one kernel where torch
takes several (RMSNorm with its residual add, SwiGLU of the fused gate_up product, the joint
rotation of q and k in place on the qkv product), rounding where the torch ops round; and the
sampler's kept floor under top-k/top-p/min-p by a search, where torch would sort the vocabulary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from shard.platforms.base import Platform

if TYPE_CHECKING:
    from shard.kv_cache import KvCacheSettings


def _rows(x: torch.Tensor) -> bool:
    """Whether x is [T, N] with unit-stride rows, as the kernels take it."""
    return x.dim() == 2 and x.stride(-1) == 1


class CudaPlatform(Platform):
    name = "cuda"
    dist_backend = "nccl"
    default_attention = "triton"
    int4_kernel = "tinygemm+triton"
    moe_kernel = "triton"
    fp8_kernel = "triton"
    # tinygemm, the decode-sized int4 GEMM, takes bf16 only (shard/layers/quant/int4_cuda.py)
    int4_activation_dtype = torch.bfloat16
    static_shapes = True
    pinned_uploads = True
    overlaps_steps = True

    def bind(self, device: torch.device, local_rank: int) -> torch.device:
        # one GPU per shard: a device without an index is this rank's
        if device.index is None:
            device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device

    def check_alive(self, device: torch.device) -> None:
        torch.zeros(2, device=device)  # fails if the device is gone

    def reset_peak_memory(self, device: torch.device) -> None:
        torch.cuda.reset_peak_memory_stats(device)

    def release_cached_memory(self, device: torch.device) -> None:
        torch.cuda.empty_cache()

    def kv_cache_budget(
        self, device: torch.device, settings: KvCacheSettings, reserved_bytes: int
    ) -> tuple[float, float]:
        # what is left of the device's share after the warmup's peak (and what will be
        # reserved beside it, CUDA graphs): the cache can never take more than that
        _, total = torch.cuda.mem_get_info(device)
        used = torch.cuda.max_memory_allocated(device) + reserved_bytes
        budget = total * settings.cuda_memory_fraction - used
        return budget, budget

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
        if not _rows(x) or weight.dtype != x.dtype:  # the kernel scales in the dtype, as Llama
            return None
        from shard.platforms.cuda.kernels.elementwise import rms_norm

        return rms_norm(x, weight, eps)[0]

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not (_rows(x) and _rows(residual)) or weight.dtype != x.dtype:
            return None
        from shard.platforms.cuda.kernels.elementwise import rms_norm

        out, summed = rms_norm(x, weight, eps, residual)
        assert summed is not None
        return out, summed

    def swiglu(self, product: torch.Tensor) -> torch.Tensor | None:
        if not _rows(product):
            return None
        from shard.platforms.cuda.kernels.elementwise import silu_mul

        return silu_mul(product)

    def fused_moe(
        self,
        x: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        act: str,
        **extras: Any,
    ) -> torch.Tensor:
        from shard.platforms.cuda.kernels.fused_moe import fused_moe

        return fused_moe(x, w13, w2, topk_weights, topk_ids, act, **extras)

    def truncation_floor(
        self, x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
    ) -> torch.Tensor | None:
        if x.dtype != torch.float32 or not _rows(x):
            return None
        from shard.platforms.cuda.kernels.truncation import truncation_floor

        return truncation_floor(x, top_k, top_p, min_p)

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        joint: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if joint is None:
            return None
        from shard.platforms.cuda.kernels.elementwise import rotary_

        # In place: q and k are the qkv product's own rows, which nothing else reads (the dims
        # past the tables' width are left as they are).
        rotary_(joint, cos, sin, rows)
        return q, k
