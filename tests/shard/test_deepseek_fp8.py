"""DeepSeek-V3 and V3.2 in transformers' fine-grained FP8 (the format DeepSeek-V3, R1, V3.2 and
Kimi K2 are released in: 128x128 blocks, `weight_scale_inv`), quantized by transformers' own
Fp8Quantize on every module its replace_with_fp8_linear converts (the latent attention's five
projections and V3.2's indexer's two,
the dense and shared MLPs, each routed expert), against transformers loading the same
checkpoint dequantized (`FineGrainedFP8Config(dequantize=True)`): logits and greedy ids; and on
two ranks, each rank's weights (kv_b_proj's absorbed halves included) equal that rank's slice
of the dequantized model.

Shapes are whole blocks, as transformers' quantizer tiles only those: 2 heads of 64 + 128
query/key dims and 64 value dims, latent and query bottlenecks of 128, experts of 128. Two
ranks cut q_b_proj's rows at 192, inside a block."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from paged_helpers import assert_every_step_equals_reference, run_paged
from safetensors.torch import save_file
from test_fp8_models import _weights as linear_and_expert_weights
from transformers import AutoModelForCausalLM, FineGrainedFP8Config

from launcher.tiny_models import build_model
from shard.distributed import Distributed
from shard.models import load_model

CPU = torch.device("cpu")
BLOCK = [128, 128]
SHAPE = dict(
    hidden_size=128, num_attention_heads=2, intermediate_size=256, num_hidden_layers=2,
    qk_nope_head_dim=64, qk_rope_head_dim=128, v_head_dim=64, q_lora_rank=128,
    kv_lora_rank=128, moe_intermediate_size=128, n_routed_experts=4, n_group=2, topk_group=1,
    num_experts_per_tok=2,
)  # fmt: skip


def _converted(model, config: FineGrainedFP8Config) -> dict[str, str]:
    """name -> class of every module transformers' replace_with_fp8_linear converts."""
    from transformers.integrations.finegrained_fp8 import (
        FP8Experts,
        FP8Linear,
        replace_with_fp8_linear,
    )
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(model.config)
    quantizer = FineGrainedFP8HfQuantizer(config)
    quantizer._normalize_modules_to_not_convert(meta)
    skip = quantizer.get_modules_to_not_convert(
        meta, config.modules_to_not_convert, meta._keep_in_fp32_modules
    )
    replace_with_fp8_linear(meta, modules_to_not_convert=skip, quantization_config=config)
    kinds = (FP8Linear, FP8Experts)
    return {n: type(m).__name__ for n, m in meta.named_modules() if isinstance(m, kinds)}


# architecture, its config beyond SHAPE, the projections of its attention in FP8. DeepSeek-V3.2
# as released: the indexer's wq_b and wk in FP8 too (8 heads of 128), its weights_proj in bf16
# (transformers leaves it so).
ARCHITECTURES = {
    "DeepseekV3ForCausalLM": ({}, 5),
    "DeepseekV32ForCausalLM": ({"index_n_heads": 8, "index_head_dim": 128, "index_topk": 12}, 7),
}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def checkpoint(tmp_path_factory, request) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant_fixtures"))
    from build_fp8 import quantize_hf  # the FP8 fixtures' Fp8Quantize over a state dict

    extra, attention_fp8 = ARCHITECTURES[request.param]
    root = tmp_path_factory.mktemp("deepseek_fp8")
    source = build_model(root / "bf16", request.param, dtype="bfloat16", **SHAPE, **extra)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
    config = FineGrainedFP8Config(
        weight_block_size=BLOCK, activation_scheme="dynamic", modules_to_not_convert=["lm_head"]
    )
    converted = _converted(model, config)
    assert sum(kind == "FP8Experts" for kind in converted.values()) == 1  # layer 1's experts
    # attention x2, dense MLP, experts, shared
    assert len(converted) == 2 * attention_fp8 + 3 + 1 + 3
    tensors = quantize_hf(model, config, converted)
    out = root / "fp8"
    shutil.copytree(source, out)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((out / "config.json").read_text())
    raw["quantization_config"] = config.to_dict()
    (out / "config.json").write_text(json.dumps(raw))
    return out


def _dequantized(path: Path):
    config = FineGrainedFP8Config(weight_block_size=BLOCK, dequantize=True)
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, quantization_config=config
    ).eval()


def test_served_as_transformers_serves_it_dequantized(checkpoint):
    ours = load_model(checkpoint, dtype=torch.float32, device=CPU, dist=Distributed())
    gen = torch.Generator().manual_seed(2)
    batch = [torch.randint(3, ours.vocab_size, (n,), generator=gen) for n in (21, 37)]
    logits, tokens = run_paged(ours, batch, 3, seed=4)
    assert_every_step_equals_reference(_dequantized(checkpoint), batch, logits, tokens, atol=1e-4)


def _weights(model) -> dict[str, torch.Tensor]:
    """Every linear's weight as it multiplies, the experts and the absorbed kv_b_proj halves."""
    found = linear_and_expert_weights(model)
    for name, buffer in model.named_buffers():
        if name.endswith(("w_uk", "w_uv")):
            found[name] = buffer
    return found


def test_each_rank_of_two_holds_its_slice_of_the_dequantized_model(checkpoint, tmp_path):
    reference = tmp_path / "reference"
    _dequantized(checkpoint).save_pretrained(reference)
    # a plain float32 checkpoint: the comparison below is FP8 against floats
    assert "quantization_config" not in json.loads((reference / "config.json").read_text())
    for rank in range(2):
        dist = Distributed(rank, 2)
        ours = _weights(load_model(checkpoint, dtype=torch.float32, device=CPU, dist=dist))
        want = _weights(load_model(reference, dtype=torch.float32, device=CPU, dist=dist))
        assert ours.keys() == want.keys()
        assert any(k.endswith("w_uk") for k in ours) and any(k.endswith("w13") for k in ours)
        for key, tensor in ours.items():
            assert torch.equal(tensor, want[key]), f"rank {rank}: {key}"
