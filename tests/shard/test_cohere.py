"""Cohere's configs: what the shared blocks cannot serve is refused by name, and the options
the two generations set reach the blocks (the logits against transformers: the vs-transformers,
CPU-decode and tensor-parallel tests' cohere cases)."""

from __future__ import annotations

import torch
from config_edits import assert_refused

from shard.distributed import Distributed
from shard.layers.norm import LayerNorm
from shard.layers.rotary import NoRotary
from shard.models import load_model

CPU = torch.device("cpu")


def test_command_r_plus_qk_norms_are_refused(tiny_model, tmp_path):
    assert_refused(
        tiny_model("cohere_parallel_layernorm"), tmp_path / "plus", {"use_qk_norm": True},
        "use_qk_norm",
    )  # fmt: skip


def test_cohere2_layers_as_configured(tiny_model):
    model = load_model(
        tiny_model("cohere2_sliding_nope"), dtype=torch.bfloat16, device=CPU, dist=Distributed()
    )
    sliding, full = model.layers
    assert (sliding.self_attn.window, full.self_attn.window) == (7, None)
    assert not isinstance(sliding.self_attn.rotary, NoRotary)
    assert isinstance(full.self_attn.rotary, NoRotary)
    assert all(layer.parallel and layer.pre_mlp_layernorm is None for layer in model.layers)
    assert isinstance(model.norm, LayerNorm) and model.norm.weight.dtype == torch.float32
    assert model.logits_scale == 0.0625 and model.config.tie_word_embeddings
