"""How many GPUs this process may use: the default for `--num-shard`."""

from __future__ import annotations


def visible_gpu_count(cuda_visible_devices: str | None) -> int:
    """GPUs visible to child processes; 0 on a CPU-only machine."""
    if cuda_visible_devices is not None:
        entries = [d for d in cuda_visible_devices.split(",") if d.strip()]
        # CUDA stops enumerating at the first invalid id, and "-1" is the idiom for "no GPU".
        if not entries or entries[0].strip() == "-1":
            return 0
    try:
        # Imported lazily: torch costs a second or two of startup that explicit
        # `--num-shard` or a hidden-GPU environment never need to pay.
        import torch
    except ImportError:
        return 0
    # device_count() honours CUDA_VISIBLE_DEVICES and queries NVML without creating a context.
    return torch.cuda.device_count()


def default_num_shard(cuda_visible_devices: str | None) -> int:
    return max(1, visible_gpu_count(cuda_visible_devices))
