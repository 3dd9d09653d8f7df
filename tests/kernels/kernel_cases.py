"""Shared inputs for the kernel tests: sequences laid out in a paged KV cache the way the router
lays them out (blocks drawn from a shuffled pool, so block tables are non-contiguous), with NaN
in every slot nobody wrote, so a kernel that reads a slot it should not shows up at once."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[dev]' on Linux)")

from shard.attention.metadata import AttentionMetadata  # noqa: E402
from shard.platforms.cpu.attention import TorchAttentionBackend  # noqa: E402
from shard.platforms.cuda.kernels import interpreting  # noqa: E402

DEVICE = torch.device("cpu" if interpreting() else "cuda")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 80, 96, 128)

# Against the torch backend computing in fp32 from the same (rounded) inputs. The kernels round
# P to the input dtype before the P.V matmul and round the output once, so the error is a few
# ulps of the output dtype: fp16 has 2^-11 relative precision, bf16 2^-8; seen in practice,
# about half of these bounds. fp32 matmuls use ieee precision (no TF32).
TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}

REFERENCE = TorchAttentionBackend()


@dataclass
class PagedBatch:
    tables: list[list[int]]
    block_size: int
    num_blocks: int

    @classmethod
    def allocate(cls, capacities: list[int], block_size: int, seed: int = 0) -> PagedBatch:
        need = [-(-n // block_size) for n in capacities]
        num_blocks = sum(need) + 3  # spare blocks stay NaN
        gen = torch.Generator().manual_seed(seed)
        pool = torch.randperm(num_blocks, generator=gen).tolist()
        tables = [[pool.pop() for _ in range(n)] for n in need]
        return cls(tables, block_size, num_blocks)

    def slots(self, seq: int, start: int, stop: int) -> list[int]:
        bs = self.block_size
        return [self.tables[seq][p // bs] * bs + p % bs for p in range(start, stop)]

    def block_tables(self) -> torch.Tensor:
        width = max(len(t) for t in self.tables)
        return torch.tensor([t + [0] * (width - len(t)) for t in self.tables], dtype=torch.int32)

    def empty_cache(self, kv_heads: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
        shape = (2, self.num_blocks, self.block_size, kv_heads, head_dim)
        return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)

    def prefill_meta(self, starts: list[int], stops: list[int]) -> AttentionMetadata:
        """Positions [start, stop) of each sequence as one packed step (start > 0: cached)."""
        q_lens = [b - a for a, b in zip(starts, stops, strict=True)]
        spans = enumerate(zip(starts, stops, strict=True))
        slots = [s for i, (a, b) in spans for s in self.slots(i, a, b)]
        return AttentionMetadata(
            is_prefill=True,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
            block_tables=self.block_tables().to(DEVICE),
            context_lens=torch.tensor(stops, dtype=torch.int32, device=DEVICE),
            cu_seqlens_q=torch.tensor([0] + q_lens, device=DEVICE).cumsum(0).to(torch.int32),
            max_seqlen_q=max(q_lens),
            max_seqlen_k=max(stops),
        )

    def decode_meta(self, context_lens: list[int]) -> AttentionMetadata:
        """One new token per sequence, at position context_len - 1."""
        slots = [self.slots(i, n - 1, n)[0] for i, n in enumerate(context_lens)]
        return AttentionMetadata(
            is_prefill=False,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
            block_tables=self.block_tables().to(DEVICE),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=DEVICE),
        )


def randn(*shape: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=DEVICE)


def fill_cache(batch: PagedBatch, cache: torch.Tensor, lens: list[int], gen) -> None:
    """Random keys/values for the first lens[i] positions of each sequence, via the reference."""
    _, _, _, kv_heads, head_dim = cache.shape
    meta = batch.prefill_meta([0] * len(lens), lens)
    k = randn(sum(lens), kv_heads, head_dim, dtype=cache.dtype, gen=gen)
    v = randn(sum(lens), kv_heads, head_dim, dtype=cache.dtype, gen=gen)
    REFERENCE.store_kv(k, v, cache, meta.slot_mapping)


def as_float(
    meta: AttentionMetadata, cache: torch.Tensor
) -> tuple[AttentionMetadata, torch.Tensor]:
    """The reference runs on CPU in fp32 from the very same (rounded) values."""
    cpu = AttentionMetadata(
        **{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in vars(meta).items()}
    )
    return cpu, cache.float().cpu()
