"""FP8 checkpoints made by their formats' own tools (tests/quant_fixtures/: llm-compressor's
FP8_DYNAMIC, FP8 and FP8_BLOCK schemes in compressed-tensors' float-quantized format;
transformers' fine-grained FP8 on a Phi-3 and on a Qwen3-MoE in the Hub's per-expert layout),
served by our loaders on the CPU (dequantized at load), against transformers on the same models
dequantized by the formats' libraries (each fixture's reference/): logits and greedy ids; and
on 2 shards (tensor and expert parallel), every rank's weights equal that rank's slice of the
library-dequantized model, read by the same loader."""

from __future__ import annotations

import pytest
import torch
from paged_helpers import assert_equals_reference, run_paged
from quant_fixtures import CPU, SERVED_FP8, fixture
from transformers import AutoModelForCausalLM

from shard.distributed import Distributed
from shard.layers.moe import FusedMoE
from shard.layers.quant.base import LinearWeight
from shard.models import load_model

STEPS = 4
ATOL = 1e-4


def is_moe(name: str) -> bool:
    return "moe" in name


def load(path, rank: int = 0, world: int = 1, expert_parallel: bool = False):
    return load_model(path, dtype=torch.float32, device=CPU, dist=Distributed(rank, world),
                      expert_parallel=expert_parallel)  # fmt: skip


@pytest.mark.parametrize("name", SERVED_FP8)
def test_logits_and_greedy_ids_match_transformers_on_the_library_dequantized_model(name):
    ours = load(fixture(name))
    ref = AutoModelForCausalLM.from_pretrained(fixture(name) / "reference", dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    batch = [torch.randint(3, ours.vocab_size, (n,), generator=gen) for n in (19, 33)]
    logits, tokens = run_paged(ours, batch, STEPS, seed=3)
    assert_equals_reference(ref, batch, logits, tokens, ATOL)


def _weights(model) -> dict[str, torch.Tensor]:
    """Every linear's weight as it multiplies (its matmul applied to the identity, [out, in])
    and every expert tensor, by module name."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, LinearWeight):
            found[name] = module(torch.eye(module.in_features)).T
        elif isinstance(module, FusedMoE):
            found[f"{name}.w13"], found[f"{name}.w2"] = module.w13, module.w2
    return found


SPLITS = [(n, False) for n in SERVED_FP8] + [(n, True) for n in SERVED_FP8 if is_moe(n)]


@pytest.mark.parametrize(("name", "expert_parallel"), SPLITS)
def test_each_rank_of_two_holds_its_slice_of_the_library_dequantized_model(name, expert_parallel):
    """Fused q/k/v and gate/up pieces cut at any output (Phi-3's v starts mid-block on 2
    shards), row-parallel inputs on block boundaries, experts sliced or whole."""
    for rank in range(2):
        ours = _weights(load(fixture(name), rank, 2, expert_parallel))
        want = _weights(load(fixture(name) / "reference", rank, 2, expert_parallel))
        assert ours.keys() == want.keys() and ours
        for key, tensor in ours.items():
            assert torch.equal(tensor, want[key]), f"rank {rank}: {key}"


def test_fp8_kv_cache_scales_are_read_as_unused(tmp_path):
    """compressed-tensors' kv_cache_scheme adds self_attn.k_scale / v_scale for an FP8 KV
    cache, which is not kept here (the cache stays in the model's dtype): the checkpoint serves
    exactly as without them."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    name = "ct_fp8_dynamic_llama"
    copy = tmp_path / name
    shutil.copytree(fixture(name), copy, ignore=shutil.ignore_patterns("reference"))
    state = load_file(copy / "model.safetensors")
    for i in range(2):
        for scale in ("k_scale", "v_scale"):
            state[f"model.layers.{i}.self_attn.{scale}"] = torch.tensor([0.25])
    save_file(state, copy / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((copy / "config.json").read_text())
    config["quantization_config"]["kv_cache_scheme"] = {
        "num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True,
    }  # fmt: skip
    (copy / "config.json").write_text(json.dumps(config))
    with_scales, without = _weights(load(copy)), _weights(load(fixture(name)))
    assert with_scales.keys() == without.keys()
    assert all(torch.equal(with_scales[k], without[k]) for k in without)
