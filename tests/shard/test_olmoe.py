"""OLMoE's config: clamped q/k/v (OLMo 1's clip_qkv) is refused by name; the release's null is
served (the logits against transformers: the vs-transformers, CPU-decode and tensor-parallel
tests' olmoe case)."""

from __future__ import annotations

import torch
from config_edits import assert_refused, with_config

from shard.distributed import Distributed
from shard.models import load_model


def test_clipped_qkv_is_refused(tiny_model, tmp_path):
    assert_refused(tiny_model("olmoe_projection_norms"), tmp_path / "clip", {"clip_qkv": 8.0},
                   "clip_qkv")  # fmt: skip
    path = with_config(tiny_model("olmoe_projection_norms"), tmp_path / "null", {"clip_qkv": None})
    model = load_model(path, dtype=torch.float32, device=torch.device("cpu"), dist=Distributed())
    assert model.config.moe.sparse_layers == (True, True) and model.config.projection_qk_norm
