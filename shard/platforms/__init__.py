"""Platforms own the device: the operations layers call (norms, gated activations, rotary,
argmax...) as one table per device type, each backed by that device's kernels. Layers and models
hold no device checks: they ask `platform_of(tensor)` (or of their weights' device, once) and
call what it has; an operation returns None where its platform has no kernel for those inputs,
and the layer computes the torch reference form, which is the same values.

- `cpu` (shard/platforms/cpu/): the native kernels (native/) in eager mode, oneDNN and AMX
  matmuls, the torch attention backend with its native kernels, --compile, the decode loop.
- `cuda` (shard/platforms/cuda/): the Triton kernels (kernels/), the Triton attention backend,
  CUDA graphs.
A device type without a platform of its own (mps, xpu...) gets the base table: torch everywhere.
"""

from __future__ import annotations

import torch

from shard.platforms.base import Platform

__all__ = ["Platform", "platform_of", "shard_device"]

_PLATFORMS: dict[str, Platform] = {}


def _build(device_type: str) -> Platform:
    # Imported on first use: the CUDA platform imports triton, which a CPU machine may lack.
    if device_type == "cpu":
        from shard.platforms.cpu import CpuPlatform

        return CpuPlatform()
    if device_type == "cuda":
        from shard.platforms.cuda import CudaPlatform

        return CudaPlatform()
    platform = Platform()
    platform.name = device_type  # torch's own ops there, under the device's name
    return platform


def platform_of(where: torch.Tensor | torch.device) -> Platform:
    """The operations table for a tensor's (or a device's) type, built once per type."""
    device_type = where.device.type if isinstance(where, torch.Tensor) else where.type
    platform = _PLATFORMS.get(device_type)
    if platform is None:
        platform = _PLATFORMS[device_type] = _build(device_type)
    return platform


def shard_device(local_rank: int) -> torch.device:
    """The device a shard process computes on, chosen once at its start: this rank's GPU where
    there are GPUs, else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
