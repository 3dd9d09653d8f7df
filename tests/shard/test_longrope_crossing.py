"""Longrope sequences that grow past the boundary while they decode (shard/step_inputs.py:
step_starts): in the step whose token sits at position B = original_max_position_embeddings, a
row whose prompt is at most B long is recomputed whole with the long tables, as transformers'
Phi3ForCausalLM.prepare_inputs_for_generation drops its cache there. Greedy ids and logprobs
then equal transformers' `generate` (PEFT's for an adapter's rows), whatever else the step holds
(decoding rows, prompt chunks, a long prompt, a constrained row, adapter rows), on one rank or
two."""

import math
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import (
    BlockPool,
    FakeContext,
    greedy_reference,
    run,
    start_warm_service,
)

BOUNDARY = 32  # the tiny Phi-3's original_max_position_embeddings


@pytest.fixture(scope="module")
def served(tiny_model):
    path = tiny_model("phi3_partial_longrope")
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    service = start_warm_service(path)
    assert service.runner.rope_regime_boundary == BOUNDARY
    return service, reference


@pytest.fixture(autouse=True)
def _clear_cache(served):
    """Each test starts from an empty batch cache, whatever the one before left."""
    yield
    run(served[0].ClearCache(pb.ClearCacheRequest(), FakeContext()))


def _reference(reference, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """transformers' greedy ids and their logprobs, step by step as `generate` computes them
    (with its recompute at the boundary)."""
    with torch.no_grad():
        out = reference.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    ids = out.sequences[0, len(prompt) :].tolist()
    assert ids == greedy_reference(reference, prompt, n)
    logprobs = [
        torch.log_softmax(step[0], -1)[token].item()
        for step, token in zip(out.logits, ids, strict=True)
    ]
    return ids, logprobs


def _collect(got: dict[int, list[pb.Generation]], generations) -> set[int]:
    for g in generations:
        got.setdefault(g.request_id, []).append(g)
    return {g.request_id for g in generations}


def _assert_reference(reference, rid: int, prompt: list[int], gens: list[pb.Generation]) -> None:
    _assert_tokens(reference, rid, prompt, [(g.tokens.ids[0], g.tokens.logprobs[0]) for g in gens])


def _assert_tokens(reference, rid: int, prompt: list[int], got: list[tuple[int, float]]) -> None:
    """Our (id, logprob) per generated token against transformers' generate."""
    ids, logprobs = _reference(reference, prompt, len(got))
    assert [token for token, _ in got] == ids, f"request {rid}"
    torch.testing.assert_close(
        torch.tensor([lp for _, lp in got]),
        torch.tensor(logprobs),
        atol=1e-4,
        rtol=0,
        msg=lambda m: f"request {rid}: {m}",
    )


def _runner_batch(service, batch_id: int):
    return service.cache[batch_id]


# 30 + 16 and 20 + 16 (the first crosses at its 3rd token, the second at its 13th) beside a
# 45-token prompt (long from the start) computed in chunks.
SHORT = [[5 + (7 * i) % 300 for i in range(30)], [11 + (13 * i) % 300 for i in range(20)]]
LONG = [9 + (3 * i) % 400 for i in range(45)]
PROMPTS = {0: SHORT[0], 1: SHORT[1], 2: LONG}


def _serve_beside_a_chunked_long_prompt(service) -> dict:
    """Drives the three requests through the servicer; what each rank saw, picklable."""
    pool = BlockPool(200, seed=3)
    got: dict[int, list[pb.Generation]] = {}
    first = pb.Batch(
        id=1,
        requests=[
            pool.request(0, SHORT[0], 16, prefill_logprobs=True),
            pool.request(1, SHORT[1], 16),
        ],
    )
    resp = run(service.Prefill(pb.PrefillRequest(batch=first), FakeContext()))
    started = _collect(got, resp.generations)
    # The long prompt joins in chunks of 10, 12, 13, 10: its third chunk shares the step in which
    # request 0 runs position 32 (recomputed whole: a second prefill row of that step).
    new = pb.Batch(id=2, requests=[pool.request(2, LONG, 8)])
    resp = run(
        service.Prefill(
            pb.PrefillRequest(batch=new, cached_batches=[resp.batch], prefill_chunks={2: 10}),
            FakeContext(),
        )
    )
    joined = _collect(got, resp.generations)
    cached = resp.batch
    cache_lens = []
    for chunk in (12, 13, 10):
        resp = run(
            service.Decode(
                pb.DecodeRequest(batches=[cached], prefill_chunks={2: chunk}), FakeContext()
            )
        )
        _collect(got, resp.generations)
        cached = resp.batch
        cache_lens.append(_runner_batch(service, cached.id).cache_lens[0].item())
    counts = [len(got[rid]) for rid in PROMPTS]
    while min(len(got[rid]) for rid in (0, 1)) < 16:
        resp = run(service.Decode(pb.DecodeRequest(batches=[cached]), FakeContext()))
        _collect(got, resp.generations)
        cached = resp.batch
        if 2 in cached.request_ids and len(got[2]) == 8:  # done: it leaves the batch
            keep = [rid for rid in cached.request_ids if rid != 2]
            cached = run(
                service.FilterBatch(
                    pb.FilterBatchRequest(batch_id=cached.id, request_ids=keep), FakeContext()
                )
            ).batch
    return {
        "started": (started, joined),
        "cache_lens": cache_lens,
        "counts_after_chunks": counts,
        "prefill_logprobs": [len(g.prefill_tokens.logprobs) for g in got[0]],
        "prompt_logprobs_kept": dict(_runner_batch(service, cached.id).prompt_logprobs),
        "tokens": {
            rid: [(g.tokens.ids[0], g.tokens.logprobs[0]) for g in gens]
            for rid, gens in got.items()
        },
    }


def _assert_served(reference, seen: dict) -> None:
    assert seen["started"] == ({0, 1}, {0, 1})
    # Request 0 ran positions 30, 31, then 0..32 at once: 33 cached, as a decoding row's.
    assert seen["cache_lens"] == [32, 33, 34]
    assert seen["counts_after_chunks"] == [5, 5, 1]
    # The recompute ran request 0's prompt again: its prompt logprobs went out once, with its
    # first token, and none were gathered again.
    assert seen["prefill_logprobs"] == [30] + [0] * 15
    assert seen["prompt_logprobs_kept"] == {}
    for rid, prompt in PROMPTS.items():
        _assert_tokens(reference, rid, prompt, seen["tokens"][rid])


def test_rows_crossing_the_boundary_beside_a_chunked_long_prompt_equal_transformers(served):
    service, reference = served
    _assert_served(reference, _serve_beside_a_chunked_long_prompt(service))


def _rank_worker(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    service = start_warm_service(model_dir)
    seen = _serve_beside_a_chunked_long_prompt(service)
    torch.save((service.runner.dist.world_size, seen), Path(out_dir) / f"rank{rank}.pt")


def test_two_ranks_recompute_alike_and_equal_transformers(served, tiny_model, tmp_path):
    """Each rank decides the recompute from its own (identical) batch: both run it in the same
    step, so their collectives pair up, and both give transformers' tokens."""
    _, reference = served
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model_dir = str(tiny_model("phi3_partial_longrope"))
    mp.spawn(_rank_worker, args=(port, model_dir, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [world for world, _ in ranks] == [2, 2]
    assert ranks[0][1] == ranks[1][1]
    _assert_served(reference, ranks[0][1])


@pytest.mark.parametrize("length", [BOUNDARY, BOUNDARY + 1, BOUNDARY - 1])
def test_prompts_at_the_boundary_equal_transformers(served, length):
    # 32: short prompt, recomputed at its first decode; 33: long from the start, never
    # recomputed; 31: recomputed at its second.
    service, reference = served
    pool = BlockPool(40, seed=length)
    prompt = [3 + (17 * i) % 450 for i in range(length)]
    resp = run(
        service.Prefill(
            pb.PrefillRequest(batch=pb.Batch(id=10, requests=[pool.request(4, prompt, 6)])),
            FakeContext(),
        )
    )
    got: dict[int, list[pb.Generation]] = {}
    _collect(got, resp.generations)
    cache_lens = []
    while len(got[4]) < 6:
        resp = run(service.Decode(pb.DecodeRequest(batches=[resp.batch]), FakeContext()))
        _collect(got, resp.generations)
        cache_lens.append(_runner_batch(service, resp.batch.id).cache_lens[0].item())
    assert cache_lens == list(range(length + 1, length + 6))
    _assert_reference(reference, 4, prompt, got[4])


def _packed(allowed: list[int], vocab: int) -> bytes:
    bits = 0
    for token in allowed:
        bits |= 1 << token
    return bits.to_bytes(math.ceil(vocab / 32) * 4, "little")


def test_a_constrained_row_crossing_in_a_mixed_step_samples_within_its_mask(served):
    # The recomputed row is a prefill row of the step, sampled beside a decoding row: its mask
    # must still be the one the sampler applies to it.
    service, reference = served
    vocab = reference.config.vocab_size
    pool = BlockPool(40, seed=9)
    crossing = [5 + (19 * i) % 400 for i in range(BOUNDARY)]
    other = [7 + (23 * i) % 400 for i in range(12)]
    batch = pb.Batch(
        id=20,
        requests=[
            pool.request(6, other, 4),
            pool.request(7, crossing, 4, constrained=True),
        ],
    )
    first_greedy = greedy_reference(reference, crossing, 1)[0]
    masks = {7: _packed(list(range(vocab)), vocab)}
    resp = run(service.Prefill(pb.PrefillRequest(batch=batch, token_masks=masks), FakeContext()))
    got: dict[int, list[pb.Generation]] = {}
    _collect(got, resp.generations)
    assert got[7][0].tokens.ids[0] == first_greedy
    forced = (first_greedy + 1) % vocab
    resp = run(
        service.Decode(
            pb.DecodeRequest(batches=[resp.batch], token_masks={7: _packed([forced], vocab)}),
            FakeContext(),
        )
    )
    _collect(got, resp.generations)
    assert got[7][1].tokens.ids[0] == forced and got[7][1].tokens.logprobs[0] == 0.0
    # The unconstrained row beside it is untouched.
    _assert_reference(reference, 6, other, got[6])
    # The forced token continues a sequence transformers can score: the next step decodes it.
    resp = run(
        service.Decode(
            pb.DecodeRequest(batches=[resp.batch], token_masks=masks),
            FakeContext(),
        )
    )
    _collect(got, resp.generations)
    sequence = crossing + [first_greedy, forced]
    with torch.no_grad():
        logits = reference(torch.tensor([sequence])).logits[0, -1]
    assert got[7][2].tokens.ids[0] == int(logits.argmax())
    torch.testing.assert_close(
        torch.tensor(got[7][2].tokens.logprobs[0]),
        torch.log_softmax(logits, -1).max(),
        atol=1e-4,
        rtol=0,
    )


def test_adapter_rows_crossing_in_mixed_steps_equal_peft_generate(tiny_model, tmp_path):
    # LoRA terms read each packed token's adapter slot: a recomputed row's whole prompt runs
    # under its adapter again, beside a base row crossing too and an adapter prompt in chunks.
    from tests.shard.lora_fixtures import PHI3_ADAPTERS, make_adapter, peft_reference
    from tests.shard.test_lora_vs_peft import lora_service

    base = tiny_model("phi3_partial_longrope")
    adapter = make_adapter(base, tmp_path / "fused", seed=41, **PHI3_ADAPTERS["fused_all_r8"])
    service = lora_service(base, {"fused": adapter}, max_loras=1)
    pool = BlockPool(60, seed=4)
    prompts = {
        0: ("", [5 + (7 * i) % 300 for i in range(30)]),
        1: ("fused", [11 + (13 * i) % 300 for i in range(28)]),
        2: ("fused", [9 + (3 * i) % 300 for i in range(45)]),
    }
    requests = [pool.request(rid, p, 16, adapter_id=a) for rid, (a, p) in prompts.items()]
    chunks = {2: 10}
    resp = run(
        service.Prefill(
            pb.PrefillRequest(batch=pb.Batch(id=30, requests=requests), prefill_chunks=chunks),
            FakeContext(),
        )
    )
    got: dict[int, list[pb.Generation]] = {}
    _collect(got, resp.generations)
    while any(len(got.get(rid, [])) < 8 for rid in prompts):
        resp = run(
            service.Decode(
                pb.DecodeRequest(batches=[resp.batch], prefill_chunks=chunks), FakeContext()
            )
        )
        _collect(got, resp.generations)
    references = {"": AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()}
    references["fused"] = peft_reference(base, adapter)
    for rid, (name, prompt) in prompts.items():
        _assert_reference(references[name], rid, prompt, got[rid])
    run(service.ClearCache(pb.ClearCacheRequest(), FakeContext()))
