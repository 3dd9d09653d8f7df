"""GPT-2 beyond the whole-model comparison (test_models_vs_transformers.py): the original
checkpoints' layout (the modules without `transformer.`, and the causal-mask buffers
`attn.bias` / `attn.masked_bias` that old saves kept), and configs refused by field."""

from __future__ import annotations

import shutil

import pytest
import torch
from config_edits import assert_refused
from paged_helpers import assert_serves_as_reference
from safetensors.torch import load_file, save_file

CPU = torch.device("cpu")
NAME = "gpt2_conv1d"


def test_the_original_layout_with_its_mask_buffers_is_read(tiny_model, tmp_path):
    source = tiny_model(NAME)
    path = tmp_path / "original"
    shutil.copytree(source, path)
    tensors = {
        k.removeprefix("transformer."): v
        for k, v in load_file(source / "model.safetensors").items()
    }
    tensors.pop("lm_head.weight", None)  # tied: the originals keep wte alone
    for layer in range(2):
        tensors[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(1, 1, 8, 8))
        tensors[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    assert_serves_as_reference(path, source)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ({"reorder_and_upcast_attn": True}, "reorder_and_upcast_attn"),
    ],
)
def test_configs_it_cannot_serve_are_refused_naming_the_field(tiny_model, tmp_path, change, field):
    assert_refused(tiny_model(NAME), tmp_path / "bad", change, field)
