"""An adapter evicted from the host cache is read again when a batch asks for it; if its files
changed or vanished meanwhile, the shard starts the Prefill without that adapter's requests and
names them in `adapter_failures`. Everything else in the step, running and new, base model and
other adapters, is computed exactly as without them; with several ranks, all agree on the
failures before the step (one rank's bad read must not split their batches)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from lora_fixtures import ALL, make_adapter, make_adapters, peft_reference
from transformers import AutoModelForCausalLM

from shard.distributed import Distributed
from shard.lora.manager import LoraManager, LoraSettings
from shard.models.config import ModelConfig
from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import BlockPool, FakeContext, greedy_reference, prompts, run
from tests.shard.test_lora_tensor_parallel import _layers
from tests.shard.test_tensor_parallel import free_port

NEW = 5
PROMPTS = [[3 + t % 300 for t in p] for p in prompts(4, seed=33)]
WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def base(tiny_model):
    return tiny_model("llama_gqa_llama3")


@pytest.fixture(scope="module")
def made(base, tmp_path_factory):
    return make_adapters(base, tmp_path_factory.mktemp("unreadable"), ["qv_r4", "all_r8"], 40)


def _service(base, adapters: dict[str, str]):
    """One slot and one host cache entry: validating `y` at startup evicts `x`."""
    settings = ShardSettings(
        model_id=str(base),
        uds_path="/unused",
        dtype="float32",
        lora_adapters=list(adapters.items()),
        max_loras=1,
        max_cpu_loras=1,
        max_lora_rank=16,
    )
    service = build_service(settings)
    run(service.Warmup(pb.WarmupRequest(max_batch_total_tokens=2048), FakeContext()))
    assert list(service.lora.cache) == ["y"]
    return service


def _decode_to_end(service, response, got: dict[int, list[int]]) -> None:
    """Decodes until every request has NEW tokens, dropping finished ones as the router does."""
    while True:
        for g in response.generations:
            got.setdefault(g.request_id, []).extend(g.tokens.ids)
        if not response.HasField("batch"):
            return
        live = [r for r in response.batch.request_ids if len(got.get(r, [])) < NEW]
        if not live:
            run(service.ClearCache(pb.ClearCacheRequest(), FakeContext()))
            return
        filtered = pb.FilterBatchRequest(batch_id=response.batch.id, request_ids=live)
        batch = run(service.FilterBatch(filtered, FakeContext())).batch
        response = run(service.Decode(pb.DecodeRequest(batches=[batch]), FakeContext()))


def test_unreadable_adapter_fails_its_requests_alone(base, made, tmp_path):
    x = tmp_path / "x"
    shutil.copytree(made["qv_r4"], x)
    service = _service(base, {"x": str(x), "y": str(made["all_r8"])})
    pool = BlockPool(100, seed=3)
    # A running base request, one decode step in.
    first = run(service.Prefill(pb.PrefillRequest(batch=pb.Batch(
        id=1, requests=[pool.request(1, PROMPTS[0], NEW)])), FakeContext()))  # fmt: skip
    got: dict[int, list[int]] = {1: list(first.generations[0].tokens.ids)}
    running = run(service.Decode(pb.DecodeRequest(batches=[first.batch]), FakeContext()))
    got[1] += running.generations[0].tokens.ids

    (x / WEIGHTS).write_bytes(b"overwritten since it was validated")
    new = [
        pool.request(2, PROMPTS[1], NEW),
        pool.request(3, PROMPTS[2], NEW, adapter_id="x"),
        pool.request(4, PROMPTS[3], NEW, adapter_id="y"),
        pool.request(5, PROMPTS[2], NEW, adapter_id="x"),
    ]
    response = run(service.Prefill(pb.PrefillRequest(
        batch=pb.Batch(id=2, requests=new), cached_batches=[running.batch],
        prefill_chunks={3: 4, 4: 100}), FakeContext()))  # fmt: skip
    [failure] = response.adapter_failures
    assert (failure.adapter_id, list(failure.request_ids)) == ("x", [3, 5])
    assert "adapter 'x'" in failure.reason and "safetensors" in failure.reason
    assert list(response.batch.request_ids) == [1, 2, 4]
    assert service.lora.slots.names == ["y"]  # x never took the slot
    _decode_to_end(service, response, got)

    reference = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with_y = peft_reference(base, made["all_r8"])
    assert got[1] == greedy_reference(reference, PROMPTS[0], NEW)
    assert got[2] == greedy_reference(reference, PROMPTS[1], NEW)
    assert got[4] == greedy_reference(with_y, PROMPTS[3], NEW)
    assert set(got) == {1, 2, 4}

    # Every new request failing, nothing else stepping: no batch, the shard keeps serving.
    lone = pb.Batch(id=3, requests=[pool.request(6, PROMPTS[2], NEW, adapter_id="x")])
    alone = run(service.Prefill(pb.PrefillRequest(batch=lone), FakeContext()))
    assert [f.adapter_id for f in alone.adapter_failures] == ["x"]
    assert not alone.HasField("batch") and not alone.generations and not service.cache

    # Its files back, the adapter is read again and served as PEFT serves it.
    shutil.copy(made["qv_r4"] / WEIGHTS, x / WEIGHTS)
    got = {}
    again = run(service.Prefill(pb.PrefillRequest(batch=pb.Batch(
        id=4, requests=[BlockPool(100).request(7, PROMPTS[2], NEW, adapter_id="x")])),
        FakeContext()))  # fmt: skip
    assert not again.adapter_failures
    _decode_to_end(service, again, got)
    assert got[7] == greedy_reference(peft_reference(base, made["qv_r4"]), PROMPTS[2], NEW)


def _rank_worker(rank: int, port: int, base: Path, adapters: list[dict], out: str) -> None:
    import torch.distributed as tdist

    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    layers = _layers(base, rank, 2, ModelConfig.load(base))
    settings = LoraSettings(adapters=adapters[rank], max_loras=2, max_cpu_loras=1, max_rank=8)
    manager = LoraManager(layers, settings, dist=Distributed(rank=rank, world_size=2))
    if rank == 1:  # only this rank's copy breaks
        (adapters[rank]["x"] / WEIGHTS).write_bytes(b"broken on rank 1 only")
    assignment = manager.assign(["x", "", "y", "x"], [])
    torch.save(
        {"slots": assignment.slots, "failed": assignment.failed, "names": manager.slots.names},
        f"{out}/rank{rank}.pt",
    )
    # Both ranks done before either tears gloo down (as tests/shard/test_tensor_parallel.py
    # does): a rank that tore down while its peer still talked aborted once in CI
    # ("terminate called without an active exception").
    tdist.barrier()
    tdist.destroy_process_group()


def test_ranks_agree_when_only_one_cannot_read_the_adapter(base, tmp_path):
    # On layer 1 only: the ranks hold that layer's TP linears alone.
    y = make_adapter(base, tmp_path / "y", seed=7, r=8, target_modules=ALL, layers_to_transform=[1])
    adapters = []
    for rank in range(2):  # each rank its own copy of x, as if their disks differed
        x = make_adapter(base, tmp_path / f"x{rank}", seed=8, r=4, layers_to_transform=[1],
                         target_modules=["q_proj", "v_proj"])  # fmt: skip
        adapters.append({"x": x, "y": y})
    mp.spawn(_rank_worker, args=(free_port(), base, adapters, str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for result in ranks:
        assert list(result["failed"]) == ["x"]
        y_slot = result["slots"][2].item()
        assert result["slots"].tolist() == [-1, -1, y_slot, -1] and y_slot >= 0
        assert "x" not in result["names"] and "y" in result["names"]
    assert "safetensors" in ranks[1]["failed"]["x"]
    assert "another shard" in ranks[0]["failed"]["x"]
