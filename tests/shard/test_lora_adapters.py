"""Adapters we cannot apply exactly are refused at load, naming the adapter and the reason; the
shard does not start serving with part of an adapter silently dropped."""

from __future__ import annotations

import pytest
import torch
from lora_fixtures import make_adapter

from shard.distributed import Distributed
from shard.lora.adapter import AdapterError
from shard.lora.manager import LoraManager, LoraSettings
from shard.models import load_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def base(tiny_model):
    return tiny_model("llama_gqa_llama3")


@pytest.fixture(scope="module")
def model(base):
    return load_model(base, dtype=torch.float32, device=CPU, dist=Distributed())


def manager(model, path, **kw) -> LoraManager:
    return LoraManager(model, LoraSettings(adapters={"ad": path}, **kw))


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (dict(r=4, target_modules=["q_proj"], use_dora=True), "DoRA adapters are not supported"),
        (dict(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]), "modules_to_save"),
        (dict(r=4, target_modules=["embed_tokens"]), r"target_modules \['embed_tokens'\]"),
        (dict(r=4, target_modules=["q_proj"], bias="lora_only"), "trained biases"),
        (
            dict(r=4, target_modules=["q_proj", "v_proj"], rank_pattern={"q_proj": 2}),
            "rank_pattern",
        ),
    ],
)
def test_what_we_cannot_apply_is_refused_by_name(base, model, tmp_path, config, reason):
    path = make_adapter(base, tmp_path / "ad", seed=0, **config)
    with pytest.raises(AdapterError, match=rf"adapter 'ad': .*{reason}"):
        manager(model, path)


def test_rank_above_the_limit_names_the_flag(base, model, tmp_path):
    path = make_adapter(base, tmp_path / "ad", seed=0, r=16, target_modules=["q_proj"])
    with pytest.raises(AdapterError, match="rank 16 exceeds --max-lora-rank 8"):
        manager(model, path, max_rank=8)


def test_an_adapter_for_another_base_is_refused(tiny_model, model, tmp_path):
    other = tiny_model("mistral_mqa")  # one KV head: k_proj has fewer outputs
    path = make_adapter(other, tmp_path / "ad", seed=0, r=4, target_modules=["k_proj"])
    with pytest.raises(AdapterError, match=r"adapter 'ad': .*k_proj has A .* another base model"):
        manager(model, path)


def test_pickled_adapter_that_is_not_plain_tensors_is_refused(base, model, tmp_path):
    path = make_adapter(base, tmp_path / "ad", seed=0, r=4, target_modules=["q_proj"])
    tensors = __import__("safetensors.torch").torch.load_file(path / "adapter_model.safetensors")
    (path / "adapter_model.safetensors").unlink()
    torch.save({"tensors": tensors, "evil": Exception("x")}, path / "adapter_model.bin")
    with pytest.raises(AdapterError, match="does not load with weights_only=True"):
        manager(model, path)


def test_missing_directory_is_named(model, tmp_path):
    with pytest.raises(AdapterError, match="adapter 'ad': cannot read .*adapter_config.json"):
        manager(model, tmp_path / "nowhere")
