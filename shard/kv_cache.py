"""Sizes the paged KV cache after warmup.

On CUDA the cache takes what is left of `cuda_memory_fraction` of the device after the peak of a
worst-case prefill (weights + activations). On CPU there is no allocator to measure, so the size
comes from the router's `--max-batch-total-tokens` when given, else from `--cpu-kv-cache-gb`,
else from a share of the memory the OS reports available.
"""

import math
from dataclasses import dataclass

import torch

from shard.platforms import platform_of
from shard.platforms.host_memory import GIB


@dataclass(frozen=True)
class KvCacheSettings:
    block_size: int
    cuda_memory_fraction: float
    cpu_kv_cache_gb: float | None


class KvCacheTooLargeError(ValueError):
    pass


# The tokens a model without K/V serves at once when the router asks no number (its state
# slots bound its batch; blocks there cost no memory).
UNCACHED_TOKENS = 1 << 20


def plan_num_blocks(
    bytes_per_token: int,
    settings: KvCacheSettings,
    device: torch.device,
    requested_tokens: int,
    reserved_bytes: int = 0,
) -> int:
    """Number of KV blocks this shard can hold; `requested_tokens` 0 means "as many as fit".
    `reserved_bytes`: device memory something else will hold beside the peak (CUDA graphs).
    A model without K/V (pure Mamba: its layers keep states alone) holds blocks for nothing:
    the router's block tables still index its tokens, as many as requested or UNCACHED_TOKENS."""
    if not bytes_per_token:
        return math.ceil((requested_tokens or UNCACHED_TOKENS) / settings.block_size)
    bytes_per_block = bytes_per_token * settings.block_size
    budget, most = platform_of(device).kv_cache_budget(device, settings, reserved_bytes)
    fits = int(budget // bytes_per_block)
    if requested_tokens:
        wanted = math.ceil(requested_tokens / settings.block_size)
        limit = int(most // bytes_per_block)
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


# The most of the cache's memory the recurrent state pools take when the router sets no
# --max-batch-size: the rest stays for the attention layers' K/V.
STATE_SHARE = 0.5


def plan_state_slots(
    bytes_per_slot: int,
    settings: KvCacheSettings,
    device: torch.device,
    requested: int,
    default: int,
) -> int:
    """Sequences a linear-attention model's state pools hold: `requested` (the router's
    --max-batch-size) when given, else `default` or as many as half the cache's memory holds."""
    if requested or not bytes_per_slot:
        return requested or default
    budget, _ = platform_of(device).kv_cache_budget(device, settings, 0)
    fits = int(budget * STATE_SHARE // bytes_per_slot)
    if fits < 1:
        raise KvCacheTooLargeError(
            f"no memory left for one sequence's linear-attention state ({bytes_per_slot} bytes)"
        )
    return min(default, fits)
