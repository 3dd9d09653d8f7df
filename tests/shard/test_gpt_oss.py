"""gpt-oss beyond the shared model comparisons (test_models_vs_transformers, test_tensor_parallel):
its MXFP4 experts read as transformers reads them, the quantization config they come with, its
half-precision forward (its CPU decode loop: tests/shard/test_cpu_decode.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from paged_helpers import run_paged
from transformers import AutoModelForCausalLM
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from launcher.quant_checks import check_quantization
from shard.distributed import Distributed
from shard.layers.quant import mxfp4
from shard.layers.quant.config import parse_quantization_config
from shard.layers.quant.mxfp4 import dequantize_mxfp4
from shard.models import load_model
from shard.weights import WeightsError

CPU = torch.device("cpu")


@pytest.mark.parametrize("chunk", [7, 1 << 20])  # chunks that split an expert's rows; one
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_dequantization_equals_transformers(dtype, chunk, monkeypatch):
    """Every code and a spread of scales, as transformers' own MXFP4 reader dequantizes them
    (it returns [E, in, out]; ours keeps the checkpoint's [E, out, in])."""
    monkeypatch.setattr(mxfp4, "CHUNK_BLOCKS", chunk)
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), dtype=torch.uint8, generator=gen)
    blocks[0, 0, 0] = torch.arange(16, dtype=torch.uint8) * 17  # both nibbles of every code
    scales = torch.randint(100, 140, (3, 10, 4), dtype=torch.uint8, generator=gen)
    want = convert_moe_packed_tensors(blocks, scales, dtype=dtype).transpose(1, 2)
    got = dequantize_mxfp4(blocks, scales, dtype)
    assert got.shape == (3, 10, 128) and got.dtype == dtype
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match=r"do not match"):
        dequantize_mxfp4(blocks, scales[..., :3], dtype)


def test_the_release_quantization_config_leaves_everything_but_the_experts_in_floats():
    config = parse_quantization_config(
        {
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
        }
    )
    assert config is not None and config.method == "mxfp4" and not config.int4_linears
    for module in ("model.layers.3.self_attn.q_proj", "model.layers.0.mlp.router", "lm_head"):
        assert not config.quantizes(module), module
    assert config.quantizes("model.layers.3.mlp.experts.gate_up_proj")
    assert config.quantizes("model.layers.3.self_attn_extra")  # a module, not a prefix


def test_mxfp4_linears_are_refused_naming_the_module(tiny_model, tmp_path):
    """An MXFP4 checkpoint whose attention is quantized too (no floating-point weight) has
    nothing here that serves it: refused at load, naming the module and the format."""
    path = tmp_path / "model"
    shutil.copytree(tiny_model("gpt_oss_mxfp4"), path)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"] = []
    (path / "config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.self_attn.o_proj.weight_blocks"] = tensors.pop(
        "model.layers.0.self_attn.o_proj.weight"
    ).to(torch.uint8)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(WeightsError, match=r"mxfp4 linears are not supported: .*o_proj"):
        load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())


def test_the_launcher_takes_the_mxfp4_release_at_shard_counts_that_split_its_experts(tiny_model):
    path = tiny_model("gpt_oss_mxfp4")
    for shards in (1, 2, 4):  # 4 heads; the experts' 96 columns split in 48 and 24
        check_quantization(None, shards, path)
    check_quantization("mxfp4", 2, path)


def test_bfloat16_tracks_float32(tiny_model):
    """The norms stay float32 (transformers keeps gpt-oss's in float32) and the sinks are
    float32; everything else runs in bfloat16 and must stay close to the float32 reference."""
    path = tiny_model("gpt_oss_mxfp4")
    ours = load_model(path, dtype=torch.bfloat16, device=CPU, dist=Distributed())
    assert ours.layers[0].mlp.experts.w13.dtype == torch.bfloat16
    assert ours.layers[0].input_layernorm.weight.dtype == torch.float32
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = torch.arange(5, 42) * 7 % 500
    logits, _ = run_paged(ours, [prompt], steps=1)
    with torch.inference_mode():
        expected = ref(prompt[None]).logits[0]
    torch.testing.assert_close(logits[0], expected, atol=5e-2, rtol=0)
