"""FP8 checkpoints' configs and tensors as the loaders read them: every scale layout (per tensor,
per channel, 128 x 128 blocks with a ragged last block), this rank's slices of them (any cut of
the outputs, input cuts on block boundaries or refused by name), fused layers whose pieces mix
FP8 and floating point, experts dequantized at load, and the refusals, each naming its field.

The tensors here are written by hand in each layout: what is checked is our reading of the
layout against its definition (value * its block's scale). Checkpoints made by the formats' own
tools, against transformers, are tests/shard/test_fp8_models.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from shard.distributed import Distributed
from shard.layers.quant.base import Piece
from shard.layers.quant.config import QuantizationConfigError, parse_quantization_config
from shard.layers.quant.fp8 import Fp8Reader
from shard.layers.quant.fp8_linear import Fp8Method, MixedFp8Method
from shard.layers.quant.fp8_source import read_dequantized
from shard.layers.quant.reader import FeatureRange
from shard.layers.quant.select import linear_method
from shard.layers.quant.unquantized import DenseWeight, UnquantizedMethod
from shard.weights import Weights, WeightsError

CPU = torch.device("cpu")
HF_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def ct_config(strategy: str, **weights) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                            "dynamic": False, "strategy": strategy, **weights},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                      "dynamic": True},
            }
        },
    }  # fmt: skip


def fp8_values(out: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(out, k, generator=gen) * 40).to(torch.float8_e4m3fn)


def expected(weight: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The layout's definition: weight[n, k] * scales[n // block[0], k // block[1]]."""
    n, k = weight.shape
    rows = torch.arange(n)[:, None] // block[0]
    cols = torch.arange(k)[None, :] // block[1]
    return weight.float() * scales.float()[rows, cols]


def checkpoint(tmp_path: Path, config: dict, tensors: dict) -> Path:
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": config}))
    return tmp_path


def triton_device() -> torch.device:
    """Where the Triton kernels run: the GPU, or the CPU interpreted (tests/conftest.py)."""
    from shard.platforms.cuda.kernels import interpreting

    return CPU if interpreting() else torch.device("cuda")


def weights_at(path: Path, config: dict, rank: int = 0, world: int = 1, triton: bool = False):
    device = triton_device() if triton else CPU
    return Weights(path, dtype=torch.float32, device=device, dist=Distributed(rank, world),
                   quantization=parse_quantization_config(config), triton=triton)  # fmt: skip


# -- configs ---------------------------------------------------------------------------------


def test_transformers_fp8_configs():
    block = parse_quantization_config(
        {**HF_BLOCK, "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"]}
    )
    assert (block.method, block.fp8, block.block, block.int4_linears) == (
        "fp8", True, (128, 128), False,
    )  # fmt: skip
    # transformers' should_convert_module: a regex up to a module boundary, or a suffix
    assert not block.quantizes("lm_head")
    assert not block.quantizes("model.layers.0.mlp.gate")
    assert block.quantizes("model.layers.0.mlp.gate_proj")
    assert block.quantizes("model.layers.10.mlp.gate")
    # AutoFP8: no blocks (per-tensor scales), its ignore list under another name
    auto = parse_quantization_config(
        {"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": None,
         "ignored_layers": ["lm_head"]}
    )  # fmt: skip
    assert auto.block is None and not auto.quantizes("lm_head") and auto.activations


def test_compressed_tensors_fp8_configs():
    channel = parse_quantization_config(ct_config("channel"))
    assert (channel.method, channel.fp8, channel.block) == ("compressed-tensors", True, None)
    assert channel.activations == "dynamic per token"
    block = parse_quantization_config(ct_config("block", block_structure=[128, 64]))
    assert block.block == (128, 64)
    assert block.row_split_ok(256, 2) and block.row_split_ok(192, 2)  # re-blocked
    assert channel.row_split_ok(200, 8)


@pytest.mark.parametrize("strategy", ["channel", "int"])
def test_compressed_tensors_ignore_matches_as_compressed_tensors_does(strategy):
    """Its "re:" entries as re.match reads them (anchored at the name's start only, as
    compressed-tensors' match_name), plain entries by name; the int and FP8 schemes alike."""
    raw = ct_config("channel")
    if strategy == "int":
        raw["format"] = "pack-quantized"
        raw["config_groups"]["group_0"]["weights"].update(type="int", num_bits=4)
        raw["config_groups"]["group_0"].pop("input_activations")
    raw["ignore"] = ["lm_head", "re:model.layers.0.mlp", "re:.*self_attn.o_proj$"]
    config = parse_quantization_config(raw)
    assert not config.quantizes("lm_head")
    assert not config.quantizes("model.layers.0.mlp.down_proj")  # a prefix match
    assert not config.quantizes("model.layers.3.self_attn.o_proj")
    assert config.quantizes("model.layers.1.mlp.down_proj")
    assert config.quantizes("model.layers.3.self_attn.q_proj")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({**HF_BLOCK, "fmt": "e5m2"}, "fmt"),
        ({**HF_BLOCK, "activation_scheme": "mixed"}, "activation_scheme"),
        ({**HF_BLOCK, "expert_dtype": "fp4"}, "expert_dtype"),
        ({**HF_BLOCK, "weight_block_size": [128]}, "weight_block_size"),
        ({**HF_BLOCK, "modules_to_convert": ["q_proj"]}, "modules_to_convert"),
        (ct_config("group", group_size=128), "strategy"),
        (ct_config("block", block_structure="128x128"), "block_structure"),
        (ct_config("channel", type="int"), "weights"),
        (ct_config("channel", dynamic=True), "weights"),
    ],
)
def test_unsupported_fp8_configs_name_the_field(raw, field):
    with pytest.raises(QuantizationConfigError, match=field):
        parse_quantization_config(raw)


def test_int_activations_with_fp8_weights_are_refused():
    raw = ct_config("channel")
    raw["config_groups"]["group_0"]["input_activations"]["type"] = "int"
    with pytest.raises(QuantizationConfigError, match="input_activations"):
        parse_quantization_config(raw)


# -- scale layouts and this rank's slices ----------------------------------------------------


def test_ragged_blocks_read_whole_and_by_output_cuts_starting_mid_block(tmp_path):
    """320 x 320 in 128 x 128 blocks (the last ones half blocks), transformers' names."""
    weight = fp8_values(320, 320, 0)
    scales = torch.rand(3, 3) + 0.5
    path = checkpoint(tmp_path, HF_BLOCK, {"m.weight": weight, "m.weight_scale_inv": scales})
    reader = Fp8Reader(parse_quantization_config(HF_BLOCK))
    want = expected(weight, scales, (128, 128))
    weights = weights_at(path, HF_BLOCK)
    whole = reader.read(weights, "m", FeatureRange.whole(320), FeatureRange.whole(320))
    assert whole.block_k == 128 and whole.scales.shape == (320, 3)
    torch.testing.assert_close(whole.dequantize(torch.float32), want, rtol=0, atol=0)
    cut = reader.read(weights, "m", FeatureRange(100, 300, 320), FeatureRange.whole(320))
    torch.testing.assert_close(cut.dequantize(torch.float32), want[100:300], rtol=0, atol=0)
    inputs = reader.read(weights, "m", FeatureRange.whole(320), FeatureRange(128, 320, 320))
    torch.testing.assert_close(inputs.dequantize(torch.float32), want[:, 128:], rtol=0, atol=0)
    # an input cut inside a block (a row-parallel rank's): its scales re-blocked finer
    inside = reader.read(weights, "m", FeatureRange.whole(320), FeatureRange(160, 320, 320))
    assert inside.block_k == 32  # gcd(128, 160 % 128)
    torch.testing.assert_close(inside.dequantize(torch.float32), want[:, 160:], rtol=0, atol=0)
    # experts are dequantized at load: any cut
    part = read_dequantized(weights, "m", FeatureRange.whole(320), FeatureRange(100, 300, 320))
    torch.testing.assert_close(part, want[:, 100:300], rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["tensor", "tensor-0d", "channel", "channel-1d", "block"])
def test_fused_qkv_over_two_ranks_equals_the_whole_layers_halves(tmp_path, layout):
    """q (128 outputs), k and v (64 each) with their own scales, compressed-tensors' names;
    each rank's fused q/k/v is its halves of each, for every scale layout."""
    sizes = {"q": 128, "k": 64, "v": 64}
    config = ct_config(
        layout.split("-")[0], **({"block_structure": [32, 32]} if layout == "block" else {})
    )
    tensors, want = {}, {}
    for i, (name, out) in enumerate(sizes.items()):
        weight = fp8_values(out, 96, i)
        shape = {"tensor": (1,), "tensor-0d": (), "channel": (out, 1), "channel-1d": (out,),
                 "block": (out // 32, 3)}[layout]  # fmt: skip
        scales = torch.rand(shape, generator=torch.Generator().manual_seed(9 + i)) + 0.5
        tensors |= {f"{name}_proj.weight": weight, f"{name}_proj.weight_scale": scales.bfloat16()}
        tensors[f"{name}_proj.input_scale"] = torch.tensor([0.5])
        grid = scales.float().reshape(-1, 1) if layout != "block" else scales.float()
        block = (32, 32) if layout == "block" else (1 if grid.shape[0] > 1 else out, 96)
        want[name] = expected(weight, grid.bfloat16(), block)
    path = checkpoint(tmp_path, config, tensors)
    for rank in range(2):
        weights = weights_at(path, config, rank, 2)
        method = linear_method(weights, [f"{n}_proj" for n in sizes])
        assert isinstance(method, Fp8Method)
        pieces = [Piece(f"{n}_proj", rank * s // 2, (rank + 1) * s // 2) for n, s in sizes.items()]
        layer = method.load_columns(weights, pieces)
        assert isinstance(layer, DenseWeight)  # the CPU dequantizes at load
        got = layer.ops.dense(layer.weight.data)
        halves = [want[n][p.start : p.stop] for n, p in zip(sizes, pieces, strict=True)]
        torch.testing.assert_close(got, torch.cat(halves), rtol=0, atol=0)
        for n in sizes:  # the static input scales are read as unused, not unexpected
            assert f"{n}_proj.input_scale" in weights.consumed


@pytest.mark.parametrize("triton", [False, True], ids=["cpu", "triton"])
def test_row_parallel_ranks_cut_blocks_anywhere(tmp_path, triton):
    """384 inputs in blocks of 128 over 2 ranks (rank 1 starts mid-block) and over 3."""
    if triton:
        pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[dev]')")
    config = ct_config("block", block_structure=[128, 128])
    gen = torch.Generator().manual_seed(3)
    tensors = {
        "o.weight": fp8_values(128, 384, 0),
        "o.weight_scale": (torch.rand(1, 3, generator=gen) + 0.5) / 1500,
    }
    path = checkpoint(tmp_path, config, tensors)
    whole = expected(tensors["o.weight"], tensors["o.weight_scale"], (128, 128))
    x = torch.randn(2, 384, generator=gen)
    for world in (2, 3):
        outputs = []
        for rank in range(world):
            weights = weights_at(path, config, rank, world, triton=triton)
            method = linear_method(weights, ["o"])
            method.check_row_split(weights, "o")
            per = 384 // world
            layer = method.load_rows(weights, Piece("o", rank * per, (rank + 1) * per))
            part = x[:, rank * per : (rank + 1) * per].to(weights.device)
            outputs.append(layer(part).cpu())
        want = (x.double() @ whole.double().T).float()
        torch.testing.assert_close(sum(outputs), want, rtol=1e-5, atol=1e-5)


def test_a_fused_layer_mixing_fp8_and_float_pieces_is_one_dense_weight(tmp_path):
    """transformers' FP8 quantizer leaves a weight that is not whole blocks (k_proj of 64
    outputs) in floating point beside FP8 ones."""
    q = fp8_values(128, 128, 0)
    scales = torch.rand(1, 1) + 0.5
    k = torch.randn(64, 128)
    tensors = {"q_proj.weight": q, "q_proj.weight_scale_inv": scales, "k_proj.weight": k}
    path = checkpoint(tmp_path, HF_BLOCK, tensors)
    weights = weights_at(path, HF_BLOCK)
    method = linear_method(weights, ["q_proj", "k_proj"])
    assert isinstance(method, MixedFp8Method)
    layer = method.load_columns(weights, [Piece("q_proj", 0, 128), Piece("k_proj", 0, 64)])
    want = torch.cat([expected(q, scales, (128, 128)), k])
    torch.testing.assert_close(layer.ops.dense(layer.weight.data), want, rtol=0, atol=0)
    assert isinstance(linear_method(weights, ["k_proj"]), UnquantizedMethod)


def test_the_triton_weight_keeps_fp8_and_multiplies_as_the_dequantized_one(tmp_path):
    pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[dev]')")
    from shard.layers.quant.fp8_linear import TritonFp8

    gen = torch.Generator().manual_seed(5)
    weight = fp8_values(96, 256, 0)
    # |value| ~ 40 over 256 inputs: scales that make the outputs O(1)
    scales = (torch.rand(1, 2, generator=gen) + 0.5) / 640
    path = checkpoint(tmp_path, HF_BLOCK, {"m.weight": weight, "m.weight_scale_inv": scales})
    weights = weights_at(path, HF_BLOCK, triton=True)
    layer = linear_method(weights, ["m"]).load_columns(weights, [Piece("m", 0, 96)])
    assert isinstance(layer, TritonFp8) and layer.weight.dtype == torch.float8_e4m3fn
    x = torch.randn(3, 256, generator=gen)
    want = (x.double() @ expected(weight, scales, (128, 128)).double().T).float()
    torch.testing.assert_close(layer(x.to(triton_device())).cpu(), want, rtol=1e-5, atol=1e-5)


def test_an_fp8_tensor_the_config_does_not_describe_is_refused_by_name(tmp_path):
    """Read without its scales, FP8 values would load as wrong weights without a word."""
    path = checkpoint(tmp_path, HF_BLOCK, {"m.weight": fp8_values(8, 8, 0)})
    weights = Weights(path, dtype=torch.float32, device=CPU, dist=Distributed())
    with pytest.raises(WeightsError, match="m.weight is stored in torch.float8_e4m3fn"):
        weights.get_tensor("m.weight")
