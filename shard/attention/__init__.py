"""Attention over the paged KV cache: the per-step metadata (metadata.py), the backend
interface and `attend` (backend.py), the torch backend (torch_backend.py, CPU) and the Triton
one (triton_backend.py, CUDA or interpreted), loaded only when chosen."""

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
