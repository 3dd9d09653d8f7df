"""Attention over the paged KV cache: the per-step metadata (metadata.py), the backend
interface, `attend` and the registry of backends by name (backend.py). The backends belong to
their platforms: "torch" (shard/platforms/cpu/attention.py: the reference in torch, with the
CPU's native kernels) and "triton" (shard/platforms/cuda/attention.py: CUDA, or interpreted),
each loaded only when chosen."""

from shard.attention.backend import AttentionBackend, attend, get_attention_backend
from shard.attention.metadata import AttentionMetadata, MixedMetadata, StepMetadata

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "MixedMetadata",
    "StepMetadata",
    "attend",
    "get_attention_backend",
]
