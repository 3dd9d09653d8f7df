"""Rotary tables sized for the positions served (shard/layers/rotary.py): a model is loaded with
at most LOAD_POSITIONS rows, and the shard's warmup sizes them to the router's longest request,
whatever max_position_embeddings says (Llama 4 Scout's 10M positions would take 10 GiB)."""

from __future__ import annotations

import pytest
import torch
from paged_helpers import run_paged
from transformers import AutoModelForCausalLM

from shard.distributed import Distributed
from shard.layers import rotary
from shard.layers.rotary import RotaryEmbedding
from shard.models import load_model
from switchyard_pb import generate_pb2
from tests.shard.servicer_helpers import FakeContext, run, start_service

CPU = torch.device("cpu")


def tables(model: torch.nn.Module) -> list[RotaryEmbedding]:
    found = [m for m in model.modules() if isinstance(m, RotaryEmbedding)]
    assert found
    return found


def test_loaded_tables_stop_at_load_positions(tiny_model, monkeypatch):
    monkeypatch.setattr(rotary, "LOAD_POSITIONS", 100)
    model = load_model(tiny_model("llama_gqa_llama3"), dtype=torch.float32, device=CPU,
                       dist=Distributed())  # fmt: skip
    assert model.max_position_embeddings > 100
    assert all(t.cos.shape[0] == t.sin.shape[0] == 100 for t in tables(model))


@pytest.mark.parametrize("name", ["llama_gqa_llama3", "phi3_partial_longrope"])
def test_retabulated_tables_give_transformers_logits(tiny_model, name):
    path = tiny_model(name)
    model = load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # past the longrope model's original length (32): both of its tables are rebuilt
    prompt = torch.arange(3, 60) % model.vocab_size
    model.tabulate_positions(64)
    assert all(t.positions == 64 for t in tables(model))
    logits, _ = run_paged(model, [prompt], steps=1)
    with torch.no_grad():
        expected = ref(prompt[None]).logits[0]
    torch.testing.assert_close(logits[0][: len(prompt)], expected, atol=2e-4, rtol=0)
    model.tabulate_positions(10**9)  # never past the model's own maximum
    assert all(t.positions == model.max_position_embeddings for t in tables(model))


def test_warmup_sizes_the_tables_for_the_longest_request(tiny_model):
    service = start_service(tiny_model("llama_gqa_llama3"))
    request = generate_pb2.WarmupRequest(max_batch_total_tokens=4096, max_total_tokens=200)
    run(service.Warmup(request, FakeContext()))
    # the longest request, and the most proposals a speculative step verifies past it
    assert {t.positions for t in tables(service.runner.model)} == {216}
