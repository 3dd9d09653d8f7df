"""Runtime adapter management on the shard (LoadAdapter / UnloadAdapter, LoraManager.add/remove):
a shard started with --enable-lora and no adapters takes them at runtime and serves them equal to
transformers + peft; a removed adapter is refused, its name can be reused for other weights (the
old slot's weights never leak into it), and every refusal leaves the shard serving."""

from __future__ import annotations

import json

import pytest
import torch
from lora_fixtures import make_adapter, make_adapters, peft_reference

from shard.__main__ import parse_args
from shard.lora.adapter import AdapterError
from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import AbortError, BlockPool, FakeContext, prompts, run

NEW_TOKENS = 5
PROMPT = [3 + t % 300 for t in prompts(1, seed=21)[0]]


@pytest.fixture(scope="module")
def base(tiny_model):
    return tiny_model("llama_gqa_llama3")


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    root = tmp_path_factory.mktemp("runtime-adapters")
    return make_adapters(base, root, ["qv_r4", "all_r8", "mlp_rslora_r16"], 30)


@pytest.fixture
def service(base):
    """No startup adapters: the LoRA state exists only because of --enable-lora."""
    settings = ShardSettings(
        model_id=str(base),
        uds_path="/unused",
        dtype="float32",
        enable_lora=True,
        max_loras=2,
        max_lora_rank=16,
    )
    service = build_service(settings)
    run(service.Warmup(pb.WarmupRequest(max_batch_total_tokens=2048), FakeContext()))
    assert service.lora is not None and service.lora.names == []
    return service


def _load(service, name: str, path) -> None:
    run(service.LoadAdapter(pb.LoadAdapterRequest(name=name, path=str(path)), FakeContext()))


def _unload(service, name: str) -> None:
    run(service.UnloadAdapter(pb.UnloadAdapterRequest(name=name), FakeContext()))


def _prefill(service, batch_id: int, adapter: str) -> pb.PrefillResponse:
    request = BlockPool(100, seed=batch_id).request(
        batch_id, PROMPT, NEW_TOKENS + 2, adapter_id=adapter
    )
    batch = pb.Batch(id=batch_id, requests=[request])
    return run(service.Prefill(pb.PrefillRequest(batch=batch), FakeContext()))


def _generate(service, adapter: str) -> list[int]:
    resp = _prefill(service, 1, adapter)
    ids = [g.tokens.ids[0] for g in resp.generations]
    while len(ids) < NEW_TOKENS:
        resp = run(service.Decode(pb.DecodeRequest(batches=[resp.batch]), FakeContext()))
        ids += [g.tokens.ids[0] for g in resp.generations]
    run(service.ClearCache(pb.ClearCacheRequest(), FakeContext()))
    return ids


def _reference(base, adapter_dir) -> list[int]:
    model = peft_reference(base, adapter_dir)
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(PROMPT) :]


def test_loaded_removed_and_reloaded_adapters_equal_peft(service, base, adapters):
    qv, allr8 = adapters["qv_r4"], adapters["all_r8"]
    _load(service, "x", qv)
    _load(service, "y", allr8)
    assert service.lora.names == ["x", "y"]
    assert _generate(service, "x") == _reference(base, qv)
    assert _generate(service, "y") == _reference(base, allr8)

    _unload(service, "x")
    assert service.lora.names == ["y"] and "x" not in service.lora.cache
    assert "x" not in service.lora.slots.names
    with pytest.raises(AbortError, match=r"INVALID_ARGUMENT.*unknown LoRA adapter\(s\) \['x'\]"):
        _prefill(service, 2, "x")
    with pytest.raises(ValueError, match=r"unknown LoRA adapter\(s\) \['x'\]; loaded: y"):
        service.lora.assign(["x"], [])

    # The name again, other weights: what is served is the new adapter, not the old slot.
    _load(service, "x", adapters["mlp_rslora_r16"])
    assert _generate(service, "x") == _reference(base, adapters["mlp_rslora_r16"])
    # And the first weights under a new name, after slots have been reused.
    _load(service, "x2", qv)
    assert _generate(service, "x2") == _reference(base, qv)
    assert _generate(service, "y") == _reference(base, allr8)


def test_refused_adapters_leave_the_shard_serving(service, base, adapters, tmp_path):
    _load(service, "x", adapters["qv_r4"])
    high_rank = make_adapter(base, tmp_path / "r32", seed=5, r=32, target_modules=["q_proj"])
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "adapter_config.json").write_text(json.dumps({"r": 4, "peft_type": "LORA"}))
    (garbage / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    cases = [
        ("x", adapters["all_r8"], "adapter 'x' is already loaded"),
        ("big", high_rank, "adapter 'big': rank 32 exceeds --max-lora-rank 16"),
        ("gone", tmp_path / "missing", "adapter 'gone': cannot read"),
        ("junk", garbage, "adapter 'junk': .* is not a readable safetensors file"),
        ("", adapters["all_r8"], "an adapter needs a non-empty name"),
    ]
    for name, path, message in cases:
        with pytest.raises(AbortError, match=f"INVALID_ARGUMENT: {message}"):
            _load(service, name, path)
    assert service.lora.names == ["x"] and list(service.lora.cache) == ["x"]
    with pytest.raises(AbortError, match="INVALID_ARGUMENT: adapter 'nope' is not loaded"):
        _unload(service, "nope")
    assert _generate(service, "x") == _reference(base, adapters["qv_r4"])


def test_an_adapter_a_cached_batch_uses_cannot_be_removed(service, adapters):
    _load(service, "x", adapters["qv_r4"])
    _prefill(service, 4, "x")  # the batch stays cached on the shard
    with pytest.raises(AbortError, match="adapter 'x' is still used by a cached batch"):
        _unload(service, "x")
    assert service.lora.names == ["x"]
    run(service.ClearCache(pb.ClearCacheRequest(), FakeContext()))
    _unload(service, "x")
    assert service.lora.names == []


def test_manager_add_and_remove_refuse_what_they_cannot_do(service, adapters):
    service.lora.add("x", adapters["qv_r4"])
    with pytest.raises(AdapterError, match="already loaded"):
        service.lora.add("x", adapters["qv_r4"])
    service.lora.remove("x")
    with pytest.raises(AdapterError, match="'x' is not loaded; loaded: none"):
        service.lora.remove("x")


def test_a_shard_without_lora_refuses_to_load(base, adapters):
    settings = ShardSettings(model_id=str(base), uds_path="/unused", dtype="float32")
    service = build_service(settings)
    assert service.lora is None
    with pytest.raises(AbortError, match="INVALID_ARGUMENT: this shard has no LoRA support"):
        _load(service, "x", adapters["qv_r4"])


def test_enable_lora_flag(tmp_path):
    argv = ["serve", "--model-id", str(tmp_path), "--uds-path", "/s"]
    assert parse_args(argv).enable_lora is False
    assert parse_args([*argv, "--enable-lora"]).enable_lora is True
    assert parse_args([*argv, "--lora-adapters", f"a={tmp_path}"]).enable_lora is True
