"""`--quantize fp8` on a floating-point checkpoint (shard/layers/quant/fp8_online.py): the model
quantized at load equals loading transformers' own FP8 quantization of the same checkpoint
(its `Fp8Quantize`, 128 x 128 blocks, weights that are not whole blocks left in floating
point), weight for weight on 1 and 2 shards, and transformers on that checkpoint (which
dequantizes it on a CPU) gives the same logits and greedy ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from paged_helpers import assert_equals_reference, run_paged
from safetensors.torch import load_file, save_file
from test_fp8_models import _weights

from launcher.tiny_models import build_model
from shard.distributed import Distributed
from shard.layers.quant.fp8_linear import MixedFp8Method
from shard.layers.quant.select import linear_method
from shard.models import load_model

CPU = torch.device("cpu")
# Whole 128 blocks everywhere but k_proj / v_proj (1 KV head of 64: left in floating point, as
# transformers leaves them, so q/k/v is one dense weight mixing FP8 and float pieces).
SHAPE = dict(hidden_size=256, intermediate_size=384, num_attention_heads=4, num_key_value_heads=1,
             vocab_size=320)  # fmt: skip


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    """(the float checkpoint, transformers' FP8 quantization of it)."""
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    root = tmp_path_factory.mktemp("fp8_online")
    float_dir = build_model(root / "float", "LlamaForCausalLM", seed=7, **SHAPE)
    config = FineGrainedFP8Config(weight_block_size=[128, 128], modules_to_not_convert=["lm_head"])

    class Quantizer:  # what Fp8Quantize reads of transformers' HfQuantizer
        quantization_config = config

    quantize = Fp8Quantize(Quantizer())
    tensors = {}
    for name, value in load_file(float_dir / "model.safetensors").items():
        linear = name.endswith("_proj.weight")
        tensors.update(quantize.convert({name: value}) if linear else {name: value})
    fp8_dir = root / "fp8"
    fp8_dir.mkdir()
    for f in float_dir.iterdir():
        if f.suffix == ".json" and f.name != "config.json":
            (fp8_dir / f.name).write_bytes(f.read_bytes())
    save_file(tensors, fp8_dir / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((float_dir / "config.json").read_text())
    raw["quantization_config"] = json.loads(config.to_json_string())
    (fp8_dir / "config.json").write_text(json.dumps(raw))
    assert tensors["model.layers.0.self_attn.k_proj.weight"].dtype == torch.float32
    assert tensors["model.layers.0.mlp.down_proj.weight"].dtype == torch.float8_e4m3fn
    return float_dir, fp8_dir


def load(path: Path, rank: int = 0, world: int = 1, quantize: str | None = None):
    return load_model(path, dtype=torch.float32, device=CPU, dist=Distributed(rank, world),
                      quantize=quantize)  # fmt: skip


@pytest.mark.parametrize("world", [1, 2])
def test_quantized_at_load_equals_transformers_quantization_weight_for_weight(checkpoints, world):
    float_dir, fp8_dir = checkpoints
    for rank in range(world):
        ours = _weights(load(float_dir, rank, world, quantize="fp8"))
        want = _weights(load(fp8_dir, rank, world))
        assert ours.keys() == want.keys() and ours
        for key, tensor in ours.items():
            assert torch.equal(tensor, want[key]), f"rank {rank} of {world}: {key}"
    # and it is quantized: not the float weights
    plain = _weights(load(float_dir))
    assert not torch.equal(
        plain["layers.0.mlp.down_proj.weight"], ours["layers.0.mlp.down_proj.weight"]
    )


def test_logits_and_greedy_ids_equal_transformers_on_its_own_quantization(checkpoints):
    from transformers import AutoModelForCausalLM

    float_dir, fp8_dir = checkpoints
    ours = load(float_dir, quantize="fp8")
    ref = AutoModelForCausalLM.from_pretrained(fp8_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    batch = [torch.randint(3, 320, (n,), generator=gen) for n in (17, 29)]
    logits, tokens = run_paged(ours, batch, 4, seed=3)
    assert_equals_reference(ref, batch, logits, tokens, 1e-4)


def test_the_fused_qkv_mixing_fp8_and_float_pieces_is_one_dense_weight(checkpoints):
    from shard.layers.quant.config_fp8 import ONLINE_FP8
    from shard.weights import Weights

    float_dir, _ = checkpoints
    weights = Weights(float_dir, dtype=torch.float32, device=CPU, dist=Distributed(),
                      quantization=ONLINE_FP8)  # fmt: skip
    attn = "model.layers.0.self_attn"
    method = linear_method(weights, [f"{attn}.{p}_proj" for p in "qkv"])
    assert isinstance(method, MixedFp8Method)
    assert linear_method(weights, ["lm_head"]).__class__.__name__ == "UnquantizedMethod"


def test_the_shard_takes_the_flag_for_a_float_checkpoint_and_fp8_only(checkpoints):
    from shard.startup import check_quantize_flag

    float_dir, fp8_dir = checkpoints
    check_quantize_flag("fp8", float_dir)
    check_quantize_flag("fp8", fp8_dir)
    with pytest.raises(ValueError, match="--quantize awq disagrees"):
        check_quantize_flag("awq", float_dir)
