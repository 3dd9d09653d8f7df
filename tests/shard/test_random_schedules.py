"""Random tiny models under random schedules, through the shard servicer: greedy ids equal
transformers.

Each seed draws an architecture (Llama, Mistral, Ministral, Qwen2, Qwen3), head counts, head dim,
layers, tied embeddings, a sliding window (or none) and a rope scaling, then runs requests of
random lengths the way a busy router would: admissions into a running batch mid-run, random
prompt chunks for requests still in their prompts, finished requests filtered out. Blocks come
from the router's own allocator with its prefix cache, and prompts share prefixes (a system
prompt cut at random lengths, identical prompts): a request admitted after another computed its
prefix reads those blocks instead (Request.prefix_len). What the fixed cases of the other tests
pin down one at a time, here in combinations nobody chose.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from launcher.tiny_models import build_model
from router.block_allocator import Allocation, BlockAllocator
from router.prefix_cache import PrefixCache
from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import (
    BLOCK_SIZE,
    FakeContext,
    greedy_reference,
    run,
    start_service,
)
from tests.shard.tiny_model_cases import LLAMA3_ROPE, YARN_ROPE

KV_TOKENS = 4096
ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "llama3": LLAMA3_ROPE,
    "yarn": YARN_ROPE,
}


def random_model(rng: random.Random) -> tuple[str, dict]:
    arch = rng.choice(
        ["LlamaForCausalLM", "MistralForCausalLM", "MinistralForCausalLM"]
        + ["Qwen2ForCausalLM", "Qwen3ForCausalLM"]
    )
    heads = rng.choice([2, 4, 8])
    layers = rng.choice([1, 2, 3])
    config = dict(
        num_attention_heads=heads,
        num_key_value_heads=rng.choice([k for k in (1, 2, 4, 8) if heads % k == 0]),
        head_dim=rng.choice([16, 32, 64]),
        num_hidden_layers=layers,
        tie_word_embeddings=rng.random() < 0.5,
        seed=rng.randrange(1000),
    )
    window = rng.choice([None, 3, 8, 17, 30])
    if arch == "MistralForCausalLM":
        config["sliding_window"] = window
    elif arch == "MinistralForCausalLM":
        config["sliding_window"] = window or 9
        kinds = ["sliding_attention", "full_attention"]
        config["layer_types"] = [rng.choice(kinds) for _ in range(layers)]
    elif arch.startswith("Qwen") and window:
        config.update(
            use_sliding_window=True,
            sliding_window=window,
            max_window_layers=rng.randrange(layers + 1),
        )
    rope = ROPES[rng.choice(sorted(ROPES))]
    if rope:
        config["rope_parameters"] = dict(rope)
    return arch, config


def _admit(allocator: BlockAllocator, rid: int, prompt: list[int], max_new: int) -> tuple:
    allocation = allocator.allocate(len(prompt) + max_new, allocator.match(prompt))
    assert allocation is not None
    request = pb.Request(
        id=rid,
        input_ids=prompt,
        blocks=allocation.blocks,
        slots=allocation.slots,
        prefix_len=allocation.cached_tokens,
        parameters=pb.NextTokenChooserParameters(temperature=1.0, top_p=1.0, typical_p=1.0),
        stopping_parameters=pb.StoppingCriteriaParameters(max_new_tokens=max_new),
    )
    return request, allocation


def serve_randomly(service, rng: random.Random, requests: dict[int, tuple[list[int], int]]):
    """Admits, chunks and filters at random until every request has its tokens; returns them
    and the prompt tokens read from the prefix cache."""
    allocator = BlockAllocator(KV_TOKENS // BLOCK_SIZE, BLOCK_SIZE, 1, PrefixCache(BLOCK_SIZE))
    allocations: dict[int, Allocation] = {}
    pending, got = list(requests), {i: [] for i in requests}
    cached, batch_id = None, 0
    for _ in range(500):
        if not pending and cached is None:
            return got, sum(a.cached_tokens for a in allocations.values())
        live = list(cached.request_ids) if cached is not None else []
        new = []
        if pending and (cached is None or rng.random() < 0.4):
            k = rng.randrange(1, len(pending) + 1)
            new, pending = pending[:k], pending[k:]
        # Any chunk size, also 0 and more than is left; decoding rows ignore theirs.
        chunks = {i: rng.randrange(0, 20) for i in live + new if rng.random() < 0.7}
        if new:
            batch_id += 1
            admitted = [_admit(allocator, i, *requests[i]) for i in new]
            allocations.update((r.id, a) for r, a in admitted)
            batch = pb.Batch(id=batch_id, requests=[r for r, _ in admitted])
            step = pb.PrefillRequest(
                batch=batch, cached_batches=[cached] if cached else [], prefill_chunks=chunks
            )
            resp = run(service.Prefill(step, FakeContext()))
        else:
            step = pb.DecodeRequest(batches=[cached], prefill_chunks=chunks)
            resp = run(service.Decode(step, FakeContext()))
        for g in resp.generations:
            got[g.request_id].extend(g.tokens.ids)
            # Decoding: the prompt and all but the newest token are in the cache.
            prompt, out = requests[g.request_id][0], got[g.request_id]
            allocator.commit(
                allocations[g.request_id], len(prompt) + len(out) - 1, lambda p=prompt, o=out: p + o
            )
        cached = resp.batch if resp.HasField("batch") else None
        if cached is None:
            continue
        keep = [r for r in cached.request_ids if len(got[r]) < requests[r][1]]
        for r in set(cached.request_ids) - set(keep):
            allocator.free(allocations[r].blocks)
        if not keep:
            run(service.ClearCache(pb.ClearCacheRequest(id=cached.id), FakeContext()))
            cached = None
        elif len(keep) < len(cached.request_ids):
            filtered = pb.FilterBatchRequest(batch_id=cached.id, request_ids=keep)
            cached = run(service.FilterBatch(filtered, FakeContext())).batch
    raise AssertionError("the schedule made no progress in 500 steps")


@pytest.mark.parametrize("seed", range(6))
def test_random_model_and_schedule_equal_transformers(seed, tmp_path):
    rng = random.Random(seed)
    arch, config = random_model(rng)
    path = build_model(tmp_path / "model", arch, hidden_size=64, **config)
    service = start_service(path)
    run(service.Warmup(pb.WarmupRequest(max_batch_total_tokens=KV_TOKENS), FakeContext()))
    system = [rng.randrange(3, 500) for _ in range(60)]
    requests = {}
    for i in range(rng.randrange(3, 9)):
        if i and rng.random() < 0.2:  # the same prompt again
            requests[i] = (list(requests[rng.randrange(i)][0]), rng.randrange(1, 25))
            continue
        head = system[: rng.choice([0, 5, 16, 17, 33, 40, 60])]
        tail = [rng.randrange(3, 500) for _ in range(rng.randrange(1, 30))]
        requests[i] = (head + tail, rng.randrange(1, 25))
    got, from_cache = serve_randomly(service, rng, requests)
    assert from_cache % BLOCK_SIZE == 0  # most seeds share blocks: 4 of these 6
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for i, (prompt, max_new) in requests.items():
        expected = greedy_reference(reference, prompt, max_new)
        assert got[i][:max_new] == expected, f"{arch} {config}: request {i} ({len(prompt)} tok)"
