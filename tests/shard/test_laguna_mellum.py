"""Laguna and Mellum beyond the comparisons with transformers (test_models_vs_transformers.py and
the others that take their tiny cases): configs the blocks cannot serve refused at load, naming
the field; a layer whose query heads do not split across the ranks refused, naming its tensor;
Mellum's multi-token-prediction layer skipped; and the tiny cases read whole by transformers,
their router cap and scaling visible in its logits, so that those comparisons test them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from paged_helpers import run_paged
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from launcher.tiny_models import build_model
from shard.distributed import Distributed
from shard.models import load_model
from shard.models.config import UnsupportedArchitectureError
from shard.weights import WeightsError
from tests.shard.tiny_model_cases import MOE_MODELS

CPU = torch.device("cpu")
LAGUNA = "laguna_head_counts_softcapped"
MELLUM = "mellum_sliding_dense_first"


def _copy(path: Path, to: Path, **config: object) -> Path:
    """The checkpoint at `path` copied to `to`, `config` written over its config.json."""
    shutil.copytree(path, to)
    raw = json.loads((to / "config.json").read_text())
    (to / "config.json").write_text(json.dumps({**raw, **config}))
    return to


def _load(path: Path, dist: Distributed | None = None) -> torch.nn.Module:
    return load_model(path, dtype=torch.float32, device=CPU, dist=dist or Distributed())


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        (LAGUNA, {"gating": "per-channel"}, "gating = 'per-channel' is not supported"),
        # (transformers reads false as per-element, with a per-element g_proj: ambiguous)
        (LAGUNA, {"gating": False}, "gating = False is not supported"),
        (
            LAGUNA,
            {"num_attention_heads_per_layer": [4, 8, 3, 6]},
            r"num_attention_heads_per_layer\[2\] = 3 must be a positive multiple of "
            r"num_key_value_heads = 2",
        ),
        (
            MELLUM,
            {"rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 500000.0,
                                   "partial_rotary_factor": 0.5}}},
            "partial_rotary_factor is not supported for Mellum",
        ),
    ],
)  # fmt: skip
def test_configs_the_blocks_cannot_serve_are_refused(tiny_model, tmp_path, name, config, message):
    path = _copy(tiny_model(name), tmp_path / name, **config)
    with pytest.raises(UnsupportedArchitectureError, match=message):
        _load(path)


def test_a_layer_whose_heads_do_not_split_is_refused(tiny_model):
    # layers of 4, 8, 2 and 6 query heads on 4 ranks: the third's 2 cannot split
    with pytest.raises(
        WeightsError,
        match=r"model\.layers\.2\.self_attn\.q_proj\.weight .* 2 heads cannot be split across "
        "world size 4",
    ):
        _load(tiny_model(LAGUNA), Distributed(rank=0, world_size=4))


def test_mellum_skips_its_multi_token_prediction_layer(tiny_model, tmp_path):
    path = _copy(tiny_model(MELLUM), tmp_path / "with_mtp", num_nextn_predict_layers=1)
    tensors = load_file(path / "model.safetensors")
    hidden = tensors["model.norm.weight"].shape[0]
    extra = {"mtp.fc.weight": torch.randn(hidden, 2 * hidden),
             "mtp.layers.0.self_attn.q_proj.weight": torch.randn(hidden, hidden)}  # fmt: skip
    save_file({**tensors, **extra}, path / "model.safetensors", metadata={"format": "pt"})
    prompts = [torch.arange(3, 30)]
    want, _ = run_paged(_load(tiny_model(MELLUM)), prompts, steps=2)
    got, _ = run_paged(_load(path), prompts, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@torch.inference_mode()
def _reference_logits(path: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model(torch.arange(3, 40)[None]).logits[0]


@pytest.mark.parametrize(
    "change", [{"moe_router_logit_softcapping": 0.0}, {"moe_routed_scaling_factor": 1.0}]
)
def test_the_router_cap_and_scale_change_the_logits(tmp_path, change):
    architecture, overrides = MOE_MODELS[LAGUNA]
    case = build_model(tmp_path / "case", architecture, **overrides)
    other = build_model(tmp_path / "other", architecture, **{**overrides, **change})
    diff = (_reference_logits(case) - _reference_logits(other)).abs().max().item()
    assert diff > 1e-2  # far past the comparisons' 1e-4


@pytest.mark.parametrize("name", [n for n in MOE_MODELS if n.startswith(("laguna", "mellum"))])
def test_transformers_reads_every_weight_of_the_tiny_cases(tiny_model, name):
    """(test_tiny_models_new_archs.py's check, for these Mixture-of-Experts cases)"""
    _, info = AutoModelForCausalLM.from_pretrained(
        tiny_model(name), dtype=torch.float32, output_loading_info=True
    )
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert info["mismatched_keys"] == set() and info["error_msgs"] == []
