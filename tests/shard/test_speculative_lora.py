"""Speculative decoding with LoRA adapters (shard/speculation.py): a verifying row's extra tokens
take its request's adapter, so the greedy ids of requests on two adapters and on the base model,
in one batch, equal PEFT's and transformers' one token at a time, with right and wrong proposals.
"""

from __future__ import annotations

import pytest
from lora_fixtures import make_adapters, peft_reference
from transformers import AutoModelForCausalLM

from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import BlockPool, FakeContext, greedy_reference, prompts, run

NEW = 12
PROMPTS = [[3 + t % 300 for t in p] for p in prompts(3, seed=51)]
ADAPTER_OF = {1: "", 2: "a", 3: "b"}


@pytest.fixture(scope="module")
def base(tiny_model):
    return tiny_model("llama_gqa_llama3")


@pytest.fixture(scope="module")
def references(base, tmp_path_factory):
    made = make_adapters(base, tmp_path_factory.mktemp("spec-lora"), ["qv_r4", "all_r8"], 60)
    plain = AutoModelForCausalLM.from_pretrained(base)
    models = {
        1: plain,
        2: peft_reference(base, made["qv_r4"]),
        3: peft_reference(base, made["all_r8"]),
    }
    want = {rid: greedy_reference(m, PROMPTS[rid - 1], NEW) for rid, m in models.items()}
    return made, want


def test_verified_tokens_take_their_requests_adapter(base, references):
    made, want = references
    settings = ShardSettings(
        model_id=str(base),
        uds_path="/unused",
        dtype="float32",
        lora_adapters=[("a", str(made["qv_r4"])), ("b", str(made["all_r8"]))],
        max_loras=2,
        max_lora_rank=16,
    )
    service = build_service(settings)
    run(service.Warmup(pb.WarmupRequest(max_batch_total_tokens=2048), FakeContext()))
    pool = BlockPool(100, seed=8)
    requests = [
        pool.request(rid, PROMPTS[rid - 1], NEW, adapter_id=ADAPTER_OF[rid]) for rid in ADAPTER_OF
    ]
    response = run(
        service.Prefill(pb.PrefillRequest(batch=pb.Batch(id=1, requests=requests)), FakeContext())
    )
    got: dict[int, list[int]] = {}
    steps = 0
    while True:
        for g in response.generations:
            got.setdefault(g.request_id, []).extend(g.tokens.ids)
        live = [r for r in response.batch.request_ids if len(got[r]) < NEW]
        if not live:
            break
        batch = response.batch
        if len(live) < len(batch.request_ids):
            keep = pb.FilterBatchRequest(batch_id=batch.id, request_ids=live)
            batch = run(service.FilterBatch(keep, FakeContext())).batch
        proposals = {}
        for rid in live:
            ahead = want[rid][len(got[rid]) : NEW - 1]
            ids = ahead[:3]
            if rid == 3 and steps % 2:  # wrong from the second token on
                ids = [*ids[:1], *((t + 1) % 300 for t in ids[1:])]
            if ids:
                proposals[rid] = pb.Proposal(ids=ids)
        step = pb.DecodeRequest(batches=[batch], proposals=proposals)
        response = run(service.Decode(step, FakeContext()))
        steps += 1
    assert {rid: ids[:NEW] for rid, ids in got.items()} == want
    assert steps < NEW - 1  # the right proposals were accepted
