"""Sizes the paged KV cache after warmup.

On CUDA the cache takes what is left of `cuda_memory_fraction` of the device after the peak of a
worst-case prefill (weights + activations). On CPU there is no allocator to measure, so the size
comes from the router's `--max-batch-total-tokens` when given, else from `--cpu-kv-cache-gb`,
else from a share of the memory the OS reports available.
"""

import math
import os
from dataclasses import dataclass

import torch

GIB = 1 << 30
# Without an explicit budget a CPU shard takes this share of available memory, capped: the cache
# is zero-filled (masked positions must not hold NaNs), so every byte of it is resident, and a CPU
# serves far fewer concurrent tokens than that cap holds for any model it can run at speed.
CPU_DEFAULT_SHARE = 0.1
CPU_DEFAULT_CAP_BYTES = 1 * GIB


@dataclass(frozen=True)
class KvCacheSettings:
    block_size: int
    cuda_memory_fraction: float
    cpu_kv_cache_gb: float | None


class KvCacheTooLargeError(ValueError):
    pass


def available_host_memory() -> int:
    """Bytes the OS reports available (MemAvailable), or total physical memory as a fallback."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def plan_num_blocks(
    bytes_per_token: int,
    settings: KvCacheSettings,
    device: torch.device,
    requested_tokens: int,
    reserved_bytes: int = 0,
) -> int:
    """Number of KV blocks this shard can hold; `requested_tokens` 0 means "as many as fit".
    `reserved_bytes`: device memory something else will hold beside the peak (CUDA graphs)."""
    bytes_per_block = bytes_per_token * settings.block_size
    if device.type == "cuda":
        _, total = torch.cuda.mem_get_info(device)
        used = torch.cuda.max_memory_allocated(device) + reserved_bytes
        budget = total * settings.cuda_memory_fraction - used
    elif settings.cpu_kv_cache_gb is not None:
        budget = settings.cpu_kv_cache_gb * GIB
    else:
        budget = min(available_host_memory() * CPU_DEFAULT_SHARE, CPU_DEFAULT_CAP_BYTES)
    fits = int(budget // bytes_per_block)
    if requested_tokens:
        wanted = math.ceil(requested_tokens / settings.block_size)
        limit = fits if device.type == "cuda" else available_host_memory() // bytes_per_block
        if wanted > limit:
            needed_gib = wanted * bytes_per_block / GIB
            available_gib = limit * bytes_per_block / GIB
            raise KvCacheTooLargeError(
                f"--max-batch-total-tokens {requested_tokens} needs {needed_gib:.2f} GiB of KV "
                f"cache per shard but only {available_gib:.2f} GiB are available"
            )
        return wanted
    if fits < 1:
        raise KvCacheTooLargeError(
            f"no memory left for the KV cache ({bytes_per_block} bytes per block of "
            f"{settings.block_size} tokens)"
        )
    return fits
