"""The host's memory as a CPU shard sizes its KV cache by it."""

import os

GIB = 1 << 30
# Without an explicit budget a CPU shard takes this share of available memory, capped: the cache
# is zero-filled (masked positions must not hold NaNs), so every byte of it is resident, and a CPU
# serves far fewer concurrent tokens than that cap holds for any model it can run at speed.
CPU_DEFAULT_SHARE = 0.1
CPU_DEFAULT_CAP_BYTES = 1 * GIB


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
