"""Protobuf batches for driving a shard directly: what the router's allocator would hand out.

Blocks are laid out contiguously per request starting at block 1 (the router never hands out
block 0, which shards may use to pad block tables).
"""

from __future__ import annotations

import math
import random

from switchyard_pb import generate_pb2 as pb


def blocks_per_request(seq_len: int, new_tokens: int, block_size: int) -> int:
    return math.ceil((seq_len + new_tokens) / block_size)


def cache_tokens_needed(batch: int, seq_len: int, new_tokens: int, block_size: int) -> int:
    """KV tokens a shard must hold for this case (block 0 included, as it is never used)."""
    return (batch * blocks_per_request(seq_len, new_tokens, block_size) + 1) * block_size


def make_batch(
    batch_id: int,
    batch: int,
    seq_len: int,
    new_tokens: int,
    block_size: int,
    vocab_size: int,
    seed: int = 0,
    sampling: dict | None = None,
) -> pb.Batch:
    """`batch` requests of `seq_len` random prompt ids, room for `new_tokens` more each; greedy,
    or with these `sampling` parameters (NextTokenChooserParameters' fields)."""
    rng = random.Random(seed)
    per = blocks_per_request(seq_len, new_tokens, block_size)
    requests = []
    for i in range(batch):
        blocks = list(range(1 + i * per, 1 + (i + 1) * per))
        slots = [
            blocks[p // block_size] * block_size + p % block_size
            for p in range(seq_len + new_tokens)
        ]
        requests.append(
            pb.Request(
                id=i,
                # Ids >= 4 skip tiny_models' special tokens (no EOS in the prompt).
                input_ids=[rng.randrange(4, vocab_size) for _ in range(seq_len)],
                parameters=pb.NextTokenChooserParameters(
                    **{
                        **dict(temperature=1.0, top_p=1.0, typical_p=1.0, repetition_penalty=1.0),
                        **(sampling or {}),
                        "seed": i,
                    }
                ),
                stopping_parameters=pb.StoppingCriteriaParameters(
                    max_new_tokens=new_tokens, ignore_eos_token=True
                ),
                blocks=blocks,
                slots=slots,
            )
        )
    return pb.Batch(
        id=batch_id,
        requests=requests,
        size=batch,
        max_tokens=batch * (seq_len + new_tokens),
        max_blocks=per,
    )


def warmup_request(block_size: int, vocab_size: int, kv_tokens: int) -> pb.WarmupRequest:
    """A Warmup that sizes the shard's KV cache to `kv_tokens` exactly; its one 16-token
    request doubles as the first run of every kernel (one small prefill)."""
    return pb.WarmupRequest(
        batch=make_batch(1, 1, 16, 1, block_size, vocab_size),
        max_input_tokens=16,
        max_total_tokens=17,
        max_prefill_tokens=16,
        max_batch_total_tokens=kv_tokens,
    )
