"""Broken or unsupported int4 checkpoints fail at load, naming the tensor or the config field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from quant_fixtures import CPU, fixture
from safetensors.torch import load_file, save_file

from shard.distributed import Distributed
from shard.layers.quant.config import QuantizationConfigError, parse_quantization_config
from shard.models import load_model
from shard.weights import WeightsError

AWQ, GPTQ, CT = "awq_gemm_g64_llama", "gptq_g64_asym_qwen2_tied", "ct_w4a16_group64_sym_llama"
LAYER = "model.layers.1"


def copy(name: str, tmp_path: Path, *, config=None, tensors=None) -> Path:
    """The fixture with its config and/or tensors changed by the given functions."""
    out = tmp_path / name
    shutil.copytree(fixture(name), out, ignore=shutil.ignore_patterns("reference"))
    if config:
        data = json.loads((out / "config.json").read_text())
        config(data["quantization_config"])
        (out / "config.json").write_text(json.dumps(data))
    if tensors:
        state = load_file(out / "model.safetensors")
        tensors(state)
        save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


def load(path: Path):
    return load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        (AWQ, "self_attn.o_proj.qzeros"),
        (AWQ, "mlp.up_proj.scales"),
        (GPTQ, "mlp.down_proj.qzeros"),
        (CT, "self_attn.k_proj.weight_scale"),
    ],
)
def test_missing_tensor_is_named(tmp_path, name, missing):
    path = copy(name, tmp_path, tensors=lambda s: s.pop(f"{LAYER}.{missing}"))
    with pytest.raises(WeightsError, match=rf"missing tensor '{LAYER}\.{missing}'"):
        load(path)


def test_group_size_that_disagrees_with_the_tensors_is_named(tmp_path):
    path = copy(AWQ, tmp_path, config=lambda q: q.update(group_size=32))
    with pytest.raises(WeightsError, match=r"q_proj\.qzeros has shape \[2, 16\].*imply \[4, 16\]"):
        load(path)


def test_scales_with_a_wrong_shape_are_named(tmp_path):
    def cut(state):
        name = f"{LAYER}.mlp.gate_proj.scales"
        state[name] = state[name][:, :-8].contiguous()

    with pytest.raises(WeightsError, match=r"gate_proj\.scales has shape \[2, 248\]"):
        load(copy(AWQ, tmp_path, tensors=cut))


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"quant_method": "awq", "bits": 3, "group_size": 64}, "bits = 3"),
        ({"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemv"}, "'gemv'"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 12}, "group_size = 12"),
        ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "'marlin'"),
        ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized"}, "'float-quantized'"),
    ],
)
def test_unsupported_config_names_the_field(raw, field):
    with pytest.raises(QuantizationConfigError, match=field):
        parse_quantization_config(raw)


def test_an_8bit_checkpoint_is_refused_by_name():
    with pytest.raises(QuantizationConfigError, match="bits = 8 is not supported for gptq"):
        load(fixture("gptq_8bit_g32_sym_llama_tied"))


def test_act_order_without_g_idx_is_named(tmp_path):
    path = copy(
        "gptq_g32_actorder_sym_llama",
        tmp_path,
        tensors=lambda s: s.pop(f"{LAYER}.mlp.up_proj.g_idx"),
    )
    with pytest.raises(WeightsError, match=rf"missing tensor '{LAYER}\.mlp\.up_proj\.g_idx'"):
        load(path)
