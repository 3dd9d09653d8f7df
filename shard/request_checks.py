"""What the shard refuses before a step touches the model: requests that would index past the
vocabulary or the KV cache, or sample from parameters with no meaning. The router validates
what clients send; these checks keep a malformed RPC (a router bug, a client of the shard's own)
from crashing a step on the device, or worse, writing into another request's KV blocks.

Every rank receives the same RPC and refuses it the same way before any collective, so a
refusal leaves the ranks in step (shard/server.py answers it with INVALID_ARGUMENT).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from shard.requests import NewRequest
from shard.sampling.params import SamplingParams


@dataclass(frozen=True)
class CacheShape:
    vocab_size: int
    num_blocks: int  # of the KV cache; 0 before Warmup
    block_size: int


def check_new_requests(
    requests: Sequence[NewRequest], shape: CacheShape, live_ids: Iterable[int]
) -> None:
    """Raises ValueError naming the first request the shard cannot start, and why."""
    if shape.num_blocks == 0:
        raise ValueError("the KV cache is not allocated yet: Warmup must run first")
    live = set(live_ids)
    check_distinct([r.id for r in requests], "the new requests")
    for r in requests:
        if r.id in live:
            raise ValueError(f"request {r.id} is already on this shard")
        _check_prompt(r, shape.vocab_size)
        _check_kv(r, shape)
        _check_sampling(r.id, r.sampling)
        bias = r.sampling.logit_bias
        if bias and not 0 <= bias[0][0] <= bias[-1][0] < shape.vocab_size:
            raise ValueError(
                f"request {r.id}: logit_bias names tokens outside [0, {shape.vocab_size})"
            )
        if r.top_n_tokens > shape.vocab_size:
            raise ValueError(
                f"request {r.id}: top_n_tokens {r.top_n_tokens} exceeds the vocabulary of "
                f"{shape.vocab_size}"
            )


def check_distinct(ids: Sequence[int], what: str) -> None:
    if len(set(ids)) != len(ids):
        raise ValueError(f"{what} name the same id twice: {list(ids)}")


def _check_prompt(r: NewRequest, vocab_size: int) -> None:
    if not r.input_ids:
        raise ValueError(f"request {r.id} has an empty prompt")
    if max(r.input_ids) >= vocab_size:
        outside = sorted({t for t in r.input_ids if t >= vocab_size})[:5]
        raise ValueError(
            f"request {r.id}: token id(s) {outside} outside the model's vocabulary of {vocab_size}"
        )


def _check_kv(r: NewRequest, shape: CacheShape) -> None:
    """Every slot lies in one of the request's own blocks, and every block in the cache."""
    if not r.blocks:
        raise ValueError(f"request {r.id} has no KV blocks")
    if max(r.blocks) >= shape.num_blocks:
        raise ValueError(
            f"request {r.id}: KV block {max(r.blocks)} is past the cache of {shape.num_blocks} "
            "blocks"
        )
    if len(r.slots) > len(r.blocks) * shape.block_size:
        raise ValueError(
            f"request {r.id}: {len(r.slots)} positions do not fit its {len(r.blocks)} blocks of "
            f"{shape.block_size}"
        )
    owners = torch.tensor(r.slots, dtype=torch.int64) // shape.block_size
    if not bool(torch.isin(owners, torch.tensor(r.blocks, dtype=torch.int64)).all()):
        raise ValueError(f"request {r.id}: KV slots outside its own blocks")


def _check_sampling(rid: int, p: SamplingParams) -> None:
    positive = {"temperature": p.temperature, "repetition_penalty": p.repetition_penalty}
    fractions = {"top_p": p.top_p, "typical_p": p.typical_p}  # in (0, 1]
    for name, value in positive.items():
        if not (0.0 < value < math.inf):
            raise ValueError(f"request {rid}: {name} {value} must be positive and finite")
    for name, value in fractions.items():
        if not (0.0 < value <= 1.0):
            raise ValueError(f"request {rid}: {name} {value} must be in (0, 1]")
    if not (0.0 <= p.min_p <= 1.0):
        raise ValueError(f"request {rid}: min_p {p.min_p} must be in [0, 1]")
    values = [p.frequency_penalty, p.presence_penalty, *(b for _, b in p.logit_bias)]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"request {rid}: penalties and logit_bias must be finite")
