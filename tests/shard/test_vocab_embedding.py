"""Vocab-parallel embedding and LM head at world size 1, and their per-rank vocab blocks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from shard.distributed import Distributed
from shard.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from shard.platforms.cpu.matmul import dense, is_packed
from shard.weights import Weights

CPU = torch.device("cpu")
VOCAB, HIDDEN = 13, 6  # odd: not divisible by a world of 2 or 4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    t = {"embed.weight": torch.randn(VOCAB, HIDDEN), "head.weight": torch.randn(VOCAB, HIDDEN)}
    path = tmp_path_factory.mktemp("embedding")
    save_file(t, path / "model.safetensors")
    return path, t


def weights_at(path, rank=0, world=1) -> Weights:
    return Weights(
        path, dtype=torch.float32, device=CPU, dist=Distributed(rank=rank, world_size=world)
    )


def test_embedding_lookup(ckpt):
    path, t = ckpt
    ids = torch.tensor([0, 12, 5, 5, 7])
    emb = VocabParallelEmbedding.load(weights_at(path), "embed.weight", VOCAB)
    assert torch.equal(emb(ids), F.embedding(ids, t["embed.weight"]))


@pytest.mark.parametrize("world", [2, 4])
def test_vocab_blocks_are_padded_equal_slices(ckpt, world):
    path, t = ckpt
    block = -(-VOCAB // world)
    padded = torch.cat([t["embed.weight"], torch.zeros(block * world - VOCAB, HIDDEN)])
    for r in range(world):
        emb = VocabParallelEmbedding.load(weights_at(path, r, world), "embed.weight", VOCAB)
        assert emb.vocab_start == r * block
        assert torch.equal(emb.weight, padded[r * block : (r + 1) * block])


def test_lm_head_gives_float32_logits_over_the_unpadded_vocab(ckpt):
    path, t = ckpt
    hidden = torch.randn(4, HIDDEN, dtype=torch.bfloat16)
    w = Weights(path, dtype=torch.bfloat16, device=CPU, dist=Distributed())
    head = ParallelLMHead.load(w, "head.weight", VOCAB)
    logits = head(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (4, VOCAB)
    torch.testing.assert_close(logits, (hidden @ t["head.weight"].bfloat16().T).float())


def test_tied_head_multiplies_with_the_embedding_weight(ckpt):
    path, t = ckpt
    emb = VocabParallelEmbedding.load(weights_at(path), "embed.weight", VOCAB)
    head = ParallelLMHead.tied(emb)
    # Packed for the CPU GEMM where this CPU packs (a copy), else the embedding's Parameter.
    assert torch.equal(dense(head.weight), emb.weight)
    assert head.weight is emb.weight or is_packed(head.weight)
    hidden = torch.randn(2, HIDDEN)
    torch.testing.assert_close(head(hidden), hidden @ t["embed.weight"].T)
