"""Driving the shard servicer directly in tests: a fake gRPC context, block tables, references."""

import asyncio
import random

import torch

from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2

BLOCK_SIZE = 16


class AbortError(Exception):
    pass


class FakeContext:
    async def abort(self, code, details):
        raise AbortError(f"{code}: {details}")


def start_service(model_dir):
    """A float32 servicer of its own (each test module keeps its own batch cache)."""
    settings = ShardSettings(model_id=str(model_dir), uds_path="/unused", dtype="float32")
    return build_service(settings)


def start_warm_service(model_dir, kv_tokens: int = 8192):
    """A servicer whose KV cache is allocated (Warmup for kv_tokens), ready for Prefill."""
    service = start_service(model_dir)
    run(service.Warmup(generate_pb2.WarmupRequest(max_batch_total_tokens=kv_tokens), FakeContext()))
    return service


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


class BlockPool:
    """Hands out shuffled blocks so block tables are non-contiguous, like a busy allocator's."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        self.free = list(range(1, num_blocks))  # block 0 is padding, as the router keeps it
        random.Random(seed).shuffle(self.free)

    def request(self, rid: int, prompt: list[int], max_new: int, **kw) -> generate_pb2.Request:
        total = len(prompt) + max_new
        blocks = [self.free.pop() for _ in range(-(-total // BLOCK_SIZE))]
        slots = [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(total)]
        kw.setdefault(
            "parameters",
            generate_pb2.NextTokenChooserParameters(
                temperature=1.0, top_p=1.0, typical_p=1.0, repetition_penalty=1.0
            ),
        )
        return generate_pb2.Request(
            id=rid,
            input_ids=prompt,
            blocks=blocks,
            slots=slots,
            stopping_parameters=generate_pb2.StoppingCriteriaParameters(max_new_tokens=max_new),
            **kw,
        )


def chooser_params(**kw) -> generate_pb2.NextTokenChooserParameters:
    """Sampling parameters that change nothing (greedy, seed 3) but those given."""
    base = dict(temperature=1.0, top_p=1.0, typical_p=1.0, repetition_penalty=1.0, seed=3)
    return generate_pb2.NextTokenChooserParameters(**{**base, **kw})


def even_ids_mask(vocab: int) -> bytes:
    """A token mask (the wire's layout) allowing the even ids only."""
    return bytes(0x55 for _ in range(-(-vocab // 32) * 4))


def run(coro):
    return asyncio.run(coro)


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(rng.randrange(5, 40))] for _ in range(n)]


def assert_same_tokens(got: dict, want: dict, atol: float = 1e-5) -> None:
    """Two runs' tokens per request, each (id, logprob, alternatives): ids and alternatives
    equal, logprobs within atol."""
    assert got.keys() == want.keys()
    for rid in want:
        assert [(t, top) for t, _, top in got[rid]] == [(t, top) for t, _, top in want[rid]], rid
        torch.testing.assert_close(
            torch.tensor([lp for _, lp, _ in got[rid]]),
            torch.tensor([lp for _, lp, _ in want[rid]]),
            atol=atol,
            rtol=0,
        )
