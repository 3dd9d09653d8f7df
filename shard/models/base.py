"""What the runner sees of a model, whatever its architecture."""

from __future__ import annotations

import torch
from torch import nn

from shard.attention import StepMetadata
from shard.layers.rotary import RotaryEmbedding


class CausalLM(nn.Module):
    num_layers: int
    # layers with a paged KV cache (the rest keep a state per sequence: linear attention)
    num_paged_layers: int
    num_kv_heads: int  # per rank
    head_dim: int
    # The cache's values are its keys (multi-head latent attention): one plane is stored and
    # read as both, halving the cache
    values_are_keys: bool = False
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

    def tabulate_positions(self, positions: int) -> None:
        """Sizes every rotary table for positions 0 .. positions - 1 (at most the model's
        max_position_embeddings): a shard's warmup, for the router's longest request."""
        for module in self.modules():
            if isinstance(module, RotaryEmbedding):
                module.tabulate(positions)

    def adapter_module(self, name: str) -> str | None:
        """A LoRA adapter's module name -> the checkpoint module it adapts; None for one in a
        part of the checkpoint the server never runs (a text-only model's vision tower)."""
        return name

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> float32 [N, vocab_size], the full vocabulary on every rank."""
        raise NotImplementedError

    # Whether some layers keep a state per sequence (linear attention), in pools of
    # `state_slots` sequences that allocate_kv_cache makes beside the paged cache.
    recurrent: bool = False

    def state_bytes_per_slot(self) -> int:
        """One sequence's state in every recurrent layer, on this rank (0: none)."""
        return 0

    def allocate_kv_cache(
        self, num_blocks: int, block_size: int, state_slots: int = 0
    ) -> list[torch.Tensor]:
        """One [2, num_blocks, block_size, kv_heads, head_dim] tensor per paged layer, keys then
        values (a model with recurrent layers adds their state pools: DecoderModel). Where the
        values are the keys, both planes are one: a stride-0 view of a single plane, so every
        backend keeps reading [0] as keys and [1] as values (and writes both alike)."""
        return [
            self.paged_cache(num_blocks, block_size, self.num_kv_heads, self.head_dim)
            for _ in range(self.num_paged_layers)
        ]

    def paged_cache(
        self, num_blocks: int, block_size: int, kv_heads: int, head_dim: int
    ) -> torch.Tensor:
        """One layer's [2, num_blocks, block_size, kv_heads, head_dim] cache."""
        planes = 1 if self.values_are_keys else 2
        shape = (planes, num_blocks, block_size, kv_heads, head_dim)
        # Zeroed rather than empty: never-written slots then hold finite values.
        return torch.zeros(shape, dtype=self.dtype, device=self.device).expand(2, *shape[1:])

    def kv_cache_bytes_per_token(self) -> int:
        """Keys and values of one token in every layer, on this rank."""
        element = torch.empty((), dtype=self.dtype).element_size()
        planes = 1 if self.values_are_keys else 2
        return planes * self.num_paged_layers * self.num_kv_heads * self.head_dim * element
