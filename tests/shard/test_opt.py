"""OPT beyond the whole-model comparison (test_models_vs_transformers.py): the original
checkpoints' layout (the decoder's names without `model.`, as facebook/opt-* ship), and OPT-350m's
shape refused by name."""

from __future__ import annotations

import shutil

import pytest
import torch
from config_edits import assert_refused
from paged_helpers import assert_serves_as_reference
from safetensors.torch import load_file, save_file

CPU = torch.device("cpu")
NAME = "opt_learned_positions"


def test_the_original_names_without_model_are_read(tiny_model, tmp_path):
    source = tiny_model(NAME)
    path = tmp_path / "original"
    shutil.copytree(source, path)
    tensors = load_file(source / "model.safetensors")
    renamed = {k.removeprefix("model."): v for k, v in tensors.items()}
    assert any(k.startswith("decoder.") for k in renamed)
    save_file(renamed, path / "model.safetensors", metadata={"format": "pt"})
    assert_serves_as_reference(path, source)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"do_layer_norm_before": False}, "do_layer_norm_before"),
        ({"word_embed_proj_dim": 32}, "word_embed_proj_dim"),
        ({"_remove_final_layer_norm": True}, "_remove_final_layer_norm"),
    ],
)
def test_shapes_it_cannot_serve_are_refused_naming_the_field(tiny_model, tmp_path, change, field):
    assert_refused(tiny_model(NAME), tmp_path / "bad", change, field)
