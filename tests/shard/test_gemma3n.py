"""Gemma 3n beyond the whole-model comparisons (test_models_vs_transformers.py and the lists in
test_tensor_parallel.py, test_cuda_graphs.py, tests/kernels/test_models_triton.py,
test_lora_new_archs.py): the released layout (Gemma3nForConditionalGeneration: the language
model under `model.language_model.`, the vision and audio towers and their embedders beside it,
skipped) served as the language model alone, and configs refused by field.

The wrapper's towers need timm to build, which the test machines lack: the released layout is
the tiny language model's own checkpoint with its tensors renamed as the releases name them
and tower tensors added, its config transformers' Gemma3nConfig around the text config."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from config_edits import assert_refused
from paged_helpers import assert_serves_as_reference
from safetensors.torch import load_file, save_file

from shard.distributed import Distributed
from shard.models import load_model

CPU = torch.device("cpu")
NAME = "gemma3n_altup_laurel_sparse"


def _released(source, path):
    """`source` (a Gemma3nForCausalLM checkpoint) in the released wrapper's layout."""
    shutil.copytree(source, path)
    tensors = load_file(source / "model.safetensors")
    nested = {k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()}
    gen = torch.Generator().manual_seed(3)
    for tower in (
        "model.vision_tower.stem.weight",
        "model.audio_tower.conv.weight",
        "model.embed_vision.embedding.weight",
        "model.embed_audio.embedding.weight",
    ):
        nested[tower] = torch.randn(4, 4, generator=gen)  # fmt: skip
    (path / "model.safetensors").unlink()
    save_file(nested, path / "model.safetensors", metadata={"format": "pt"})
    text = json.loads((source / "config.json").read_text())
    config = transformers.Gemma3nConfig(text_config=text)
    config.architectures = ["Gemma3nForConditionalGeneration"]
    config.save_pretrained(path)
    return path


def test_the_released_layout_is_served_as_its_language_model(tiny_model, tmp_path):
    source = tiny_model(NAME)
    path = _released(source, tmp_path / "released")
    ours = load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())
    assert type(ours).__name__ == "Gemma3nForConditionalGeneration"
    assert_serves_as_reference(path, source)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"altup_active_idx": 4}, "altup_active_idx"),
        ({"activation_sparsity_pattern": [1.0, 0.0, 0.0, 0.0]}, "activation_sparsity_pattern"),
        ({"num_kv_shared_layers": 4}, "num_kv_shared_layers"),
    ],
)
def test_configs_it_cannot_serve_are_refused_naming_the_field(tiny_model, tmp_path, change, field):
    assert_refused(tiny_model(NAME), tmp_path / "bad", change, field)
