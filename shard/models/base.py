"""What the runner sees of a model, whatever its architecture."""

from __future__ import annotations

import torch
from torch import nn

from shard.attention import StepMetadata


class CausalLM(nn.Module):
    num_layers: int
    num_kv_heads: int  # per rank
    head_dim: int
    vocab_size: int  # unpadded
    max_position_embeddings: int
    eos_token_ids: list[int]
    dtype: torch.dtype
    device: torch.device

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: StepMetadata,
    ) -> torch.Tensor:
        """input_ids, positions [T] int64 -> final hidden states [T, hidden]."""
        raise NotImplementedError

    def adapter_module(self, name: str) -> str | None:
        """A LoRA adapter's module name -> the checkpoint module it adapts; None for one in a
        part of the checkpoint the server never runs (a text-only model's vision tower)."""
        return name

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> float32 [N, vocab_size], the full vocabulary on every rank."""
        raise NotImplementedError

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> list[torch.Tensor]:
        # Zeroed rather than empty: never-written slots then hold finite values.
        shape = (2, num_blocks, block_size, self.num_kv_heads, self.head_dim)
        return [
            torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)
        ]

    def kv_cache_bytes_per_token(self) -> int:
        """Keys and values of one token in every layer, on this rank."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element
