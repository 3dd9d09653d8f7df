"""`--cuda-graphs`: which decode batch sizes get a CUDA graph (shard/platforms/cuda/graphs.py).
Apart from it, without torch, so that the launcher checks the flag before it starts anything."""

from __future__ import annotations

# TGI's default is 1 .. 32; vLLM captures up to 512. Beyond 128 rows a step's kernels are long
# enough that launches no longer dominate, and every bucket costs capture time and pool memory.
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class CudaGraphsError(ValueError):
    """--cuda-graphs asks for what this shard cannot do; the message names the flag."""


def parse_buckets(value: str) -> tuple[int, ...] | None:
    """`--cuda-graphs`: "" (default: DEFAULT_BUCKETS on a GPU, none on a CPU), "0" (off), or
    batch sizes "1,2,4,8"."""
    value = value.strip()
    if not value:
        return None
    try:
        sizes = [int(part) for part in value.split(",")]
    except ValueError:
        raise CudaGraphsError(
            f"--cuda-graphs takes batch sizes like 1,2,4,8 (or 0 for none), got {value!r}"
        ) from None
    if sizes == [0]:
        return ()
    if any(size < 1 for size in sizes):
        raise CudaGraphsError(f"--cuda-graphs batch sizes must be at least 1, got {value!r}")
    return tuple(sorted(set(sizes)))
