"""Vocab-parallel token embedding and LM head.

The vocabulary is padded up to a multiple of the world size so every rank holds an equal block
of rows (the padding rows are zero and their logits are cut off before anyone sees them).
The LM head may share the embedding's weight (tied embeddings) and may add a bias (Phi's). The
head multiplies with its own `prepare_weight` copy: on a CPU that packs weights, a tied head
costs one more vocab x hidden matrix of memory and reads it several times faster than the
embedding's row layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shard.distributed import Distributed
from shard.platforms import platform_of
from shard.weights import Weights, WeightsError


def _read_vocab_block(weights: Weights, name: str, vocab_size: int) -> torch.Tensor:
    world, rank = weights.dist.world_size, weights.dist.rank
    rows = weights.shape(name)[0]
    if rows < vocab_size:
        raise WeightsError(f"{name}: dim 0 has {rows} rows, fewer than vocab_size {vocab_size}")
    block = -(-vocab_size // world)
    start, stop = min(rank * block, vocab_size), min((rank + 1) * block, vocab_size)
    # The last rank's block runs past the vocabulary: its tail rows are zero padding.
    return weights.get_concat([(name, start, stop)], 0, size=block)


class VocabParallelEmbedding(nn.Module):
    """Each rank looks up the ids in its vocab block, zeros the rest; all_reduce sums them."""

    def __init__(
        self,
        weight: torch.Tensor,
        vocab_size: int,
        dist: Distributed,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [padded_vocab / world, hidden]
        self.vocab_size = vocab_size
        self.dist = dist
        self.vocab_start = dist.rank * weight.shape[0]
        # Gemma multiplies the looked-up rows by sqrt(hidden), rounded to the dtype first as
        # transformers does (its normalizer is a tensor of the hidden states' dtype).
        self.scale = None
        if scale is not None:
            self.scale = torch.tensor(scale, dtype=weight.dtype, device=weight.device)

    @classmethod
    def load(
        cls, weights: Weights, name: str, vocab_size: int, scale: float | None = None
    ) -> VocabParallelEmbedding:
        return cls(_read_vocab_block(weights, name, vocab_size), vocab_size, weights.dist, scale)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.dist.world_size == 1:
            out = F.embedding(input_ids, self.weight)
        else:
            local = input_ids - self.vocab_start
            outside = (local < 0) | (local >= self.weight.shape[0])
            out = F.embedding(local.masked_fill(outside, 0), self.weight)
            out.masked_fill_(outside.unsqueeze(-1), 0)
            # one rank holds each row, the others add zeros: the sum is exact, scaled after
            out = self.dist.all_reduce(out)
        return out if self.scale is None else out * self.scale


class ParallelLMHead(nn.Module):
    """Local logits for this rank's vocab block, all_gather'ed into the full (unpadded) vocab."""

    def __init__(
        self,
        weight: nn.Parameter | torch.Tensor,
        vocab_size: int,
        dist: Distributed,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        # A tied head packs a copy of the embedding's weight (both are read-only after load);
        # where nothing is packed it holds the embedding's Parameter itself.
        self.ops = platform_of(weight.device)
        plain = weight.data if isinstance(weight, nn.Parameter) else weight
        packed = self.ops.prepare_weight(plain)
        if isinstance(weight, nn.Parameter) and packed is weight.data:
            self.weight = weight
        else:
            self.weight = nn.Parameter(packed, requires_grad=False)
        self.vocab_size = vocab_size
        self.dist = dist
        # Phi's head adds a bias (this rank's vocab block of it, zero past the vocabulary), in
        # the product as nn.Linear adds it: here, so that every platform's logits have it
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def load(
        cls, weights: Weights, name: str, vocab_size: int, bias: str | None = None
    ) -> ParallelLMHead:
        """`bias`: the checkpoint name of the head's bias, where it has one."""
        return cls(
            _read_vocab_block(weights, name, vocab_size),
            vocab_size,
            weights.dist,
            None if bias is None else _read_vocab_block(weights, bias, vocab_size),
        )

    @classmethod
    def tied(
        cls,
        embedding: VocabParallelEmbedding,
        weights: Weights | None = None,
        bias: str | None = None,
    ) -> ParallelLMHead:
        """The embedding's weight as the head's; `bias`: the checkpoint name of a bias of the
        head's own, read from `weights` (Phi's head keeps its bias when its weight is tied)."""
        block = None
        if bias is not None:
            assert weights is not None, "a tied head's bias is read from the checkpoint"
            block = _read_vocab_block(weights, bias, embedding.vocab_size)
        return cls(embedding.weight, embedding.vocab_size, embedding.dist, block)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> float32 [N, vocab_size], the full vocabulary on every rank."""
        local = self.ops.linear(hidden, self.weight, self.bias)
        logits = self.dist.all_gather(local, dim=-1)
        return logits[:, : self.vocab_size].float()
