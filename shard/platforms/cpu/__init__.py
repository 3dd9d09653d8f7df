"""The CPU platform: the native kernels (shard/platforms/cpu/native/, built on first use), in eager
mode, on float tensors of the dtypes they compute in (under --compile inductor fuses the torch forms
itself, and an opaque call would stop it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from shard.platforms import grouped_moe
from shard.platforms.base import Platform
from shard.platforms.cpu import lora_amx, matmul, matmul_amx
from shard.platforms.cpu.native import build as native_build
from shard.platforms.cpu.native.eager import eager_cpu_kernel, heads_contiguous

MAX_NATIVE_HEAD_DIM = 512  # elementwise.cpp's kMaxHeadDim


class CpuPlatform(Platform):
    name = "cpu"
    int4_kernel = "cpu"
    int4_activation_dtype = torch.bfloat16  # torch's CPU int4 matmul (quant/int4_cpu.py)

    def threads(self, world_size: int) -> None:
        if world_size > 1:
            # CPU shards share the machine's cores; one OpenMP pool each the size of the
            # machine would oversubscribe it N times.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))

    def warm(self, attention: str) -> None:
        if attention == "torch":
            native_build.paged_decode_kernel()  # built (once per machine) or found before ready

    def prepare_weight(self, weight: torch.Tensor) -> torch.Tensor:
        return matmul.prepare_weight(weight)

    def dense(self, weight: torch.Tensor) -> torch.Tensor:
        return matmul.dense(weight)

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return matmul.linear(x, weight, bias)

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
        # the grouped GEMMs through this CPU's matmul (half-precision weights widened to fp32
        # for the experts with rows enough, where the CPU has no native half GEMM); a decode
        # step's few rows per expert in one native call there
        return grouped_moe.grouped_experts(
            x, w13, w2, topk_weights, topk_ids, act, swiglu=self.swiglu, linear=matmul.linear,
            swiglu_experts=matmul.swiglu_experts, **extras,
        )  # fmt: skip

    def gated_linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str
    ) -> torch.Tensor | None:
        if act != "silu" or not matmul_amx.is_packed(weight):
            return None
        return matmul_amx.linear_silu_mul(x, weight, bias)  # SwiGLU in the tile epilogue

    def lora_kernel(self) -> Callable[..., None] | None:
        return native_build.lora_kernel()

    def lora_tile_kernel(
        self, weight: torch.Tensor, out_slices: tuple[int, ...]
    ) -> Callable[..., torch.Tensor] | None:
        return lora_amx.kernel_for(weight, out_slices)  # the AMX tile kernel's

    def lora_tiles(self, lora_a: torch.Tensor, lora_b: torch.Tensor, rank: int) -> Any:
        return lora_amx.LoraTiles.build(lora_a, lora_b, rank)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
        kernel = eager_cpu_kernel(native_build.rms_norm_kernel, x)
        if kernel is None or x.dim() not in (2, 3) or x.stride(-1) != 1 or weight.dtype != x.dtype:
            return None
        return kernel(x, weight, eps)  # type: ignore[no-any-return]

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        kernel = eager_cpu_kernel(native_build.add_rms_norm_kernel, x)
        if (
            kernel is None
            or x.dim() != 2
            or x.shape != residual.shape
            or x.stride(-1) != 1
            or residual.stride(-1) != 1
            or not x.dtype == residual.dtype == weight.dtype
        ):
            return None
        return kernel(x, residual, weight, eps)  # type: ignore[no-any-return]

    def silu_and_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
        kernel = eager_cpu_kernel(native_build.silu_mul_kernel, gate)
        if (
            kernel is None
            or gate.dim() != 2
            or gate.shape != up.shape
            or gate.dtype != up.dtype
            or gate.stride(1) != 1
            or up.stride(1) != 1
        ):
            return None
        return kernel(gate, up)  # type: ignore[no-any-return]

    def swiglu(self, product: torch.Tensor) -> torch.Tensor | None:
        return self.silu_and_mul(*product.chunk(2, dim=-1))

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        joint: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        kernel = eager_cpu_kernel(native_build.rotary_kernel, q)
        if (
            kernel is None
            or rows.dtype != torch.int64
            or q.dtype != k.dtype
            or q.shape[-1] > MAX_NATIVE_HEAD_DIM
        ):
            return None
        rows = rows.contiguous()
        if joint is not None:
            rotated = kernel(joint, cos, sin, rows)
            return rotated[:, : q.shape[1]], rotated[:, q.shape[1] :]
        if not (heads_contiguous(q) and heads_contiguous(k)):
            return None
        return kernel(q, cos, sin, rows), kernel(k, cos, sin, rows)

    def argmax(self, x: torch.Tensor) -> torch.Tensor | None:
        kernel = eager_cpu_kernel(native_build.argmax_kernel, x)
        if kernel is None or x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1:
            return None
        return kernel(x)  # type: ignore[no-any-return]
