"""Mistral Large 4 beyond the whole-model comparisons (test_models_vs_transformers.py and the
sparse-attention tests): layers reusing the indexer choice of the layer before, served as
transformers computes them, and layers reading another layer's latent cache refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from paged_helpers import assert_every_step_equals_reference, reference, run_paged

from launcher.tiny_models import build_model
from shard.distributed import Distributed
from shard.models import load_model
from shard.models.config import UnsupportedArchitectureError
from tests.shard.tiny_model_cases import MOE_MODELS

NAME = "mistral_large4_sparse_nope"
CPU = torch.device("cpu")


def _load(path):  # type: ignore[no-untyped-def]
    return load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())


def test_shared_indexer_layers_are_served_as_transformers(tmp_path):
    architecture, overrides = MOE_MODELS[NAME]
    change = {"indexer_types": ["full", "shared", "full", "shared"]}
    path = build_model(tmp_path, architecture, **{**overrides, **change})
    ours = _load(path)
    assert [layer.self_attn.indexer is None for layer in ours.layers] == [False, True, False, True]
    gen = torch.Generator().manual_seed(2)
    batch = [torch.randint(3, ours.vocab_size, (n,), generator=gen) for n in (21, 37)]
    logits, tokens = run_paged(ours, batch, 3, seed=4)
    assert_every_step_equals_reference(reference(path), batch, logits, tokens, atol=1e-4)


def test_layers_reading_another_layers_cache_are_refused(tiny_model, tmp_path):
    source = tiny_model(NAME)
    for item in source.iterdir():
        (tmp_path / item.name).symlink_to(item)
    (tmp_path / "config.json").unlink()
    config = json.loads((source / "config.json").read_text())
    config["text_config"]["kv_source_layers"] = [0, 0, 2, 3]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="kv_source_layers"):
        _load(tmp_path)
