"""How many GPUs this process may use: the default for `--num-shard`."""

from __future__ import annotations

from pathlib import Path

# One entry per GPU the loaded NVIDIA kernel driver knows (Linux).
NVIDIA_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")


def visible_gpu_count(cuda_visible_devices: str | None) -> int:
    """GPUs visible to child processes; 0 on a CPU-only machine."""
    if cuda_visible_devices is not None:
        entries = [d for d in cuda_visible_devices.split(",") if d.strip()]
        # CUDA stops enumerating at the first invalid id, and "-1" is the idiom for "no GPU".
        if not entries or entries[0].strip() == "-1":
            return 0
    if not NVIDIA_DRIVER_GPUS.is_dir():  # no NVIDIA driver loaded: no GPU, and no torch to ask
        return 0
    try:
        # Imported lazily: torch costs a second or two of startup that explicit
        # `--num-shard`, a hidden-GPU environment or a machine without the driver never pay.
        import torch
    except ImportError:
        return 0
    # device_count() honours CUDA_VISIBLE_DEVICES and queries NVML without creating a context.
    return torch.cuda.device_count()


def default_num_shard(cuda_visible_devices: str | None) -> int:
    return max(1, visible_gpu_count(cuda_visible_devices))
