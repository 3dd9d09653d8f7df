"""The int4 checkpoints under tests/quant_fixtures/, made by the formats' own tools (see its
README): each has a `reference/` twin, the same model dequantized by that tool's library."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from shard.distributed import Distributed
from shard.weights import Weights

ROOT = Path(__file__).resolve().parents[1] / "quant_fixtures"
CPU = torch.device("cpu")
# The Hub's names of Mixtral's expert projections -> the ones gptqmodel saves
MLP_EXPERT_LEAVES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def is_fp8(raw: dict) -> bool:
    """transformers' fine-grained FP8 or compressed-tensors' float-quantized format."""
    return raw.get("quant_method") == "fp8" or raw.get("format") == "float-quantized"


def _served(moe: bool, fp8: bool = False) -> list[str]:
    """The fixtures with a reference/ (8-bit GPTQ is refused by name, test_quantized_errors.py),
    dense or Mixture-of-Experts, int4 or FP8."""
    names = []
    for p in ROOT.iterdir():
        if not (p / "reference").is_dir():
            continue
        config = json.loads((p / "config.json").read_text())
        raw = config["quantization_config"]
        experts = any(k in config for k in ("num_experts", "num_local_experts"))
        if is_fp8(raw) != fp8 or experts != moe:
            continue
        if fp8 or raw.get("bits", 4) == 4:
            names.append(p.name)
    return sorted(names)


# Every dense fixture we serve: test_quantized_models.py and test_int4_cpu.py load their MLPs'
# gate/up/down as int4 linears.
SERVED = _served(moe=False)
# Mixture-of-Experts fixtures we serve (int4 attention, floating-point experts), which have no
# MLP linears: test_quantized_moe.py serves them.
SERVED_MOE = _served(moe=True)
# FP8 checkpoints, dense and Mixture-of-Experts: test_fp8_models.py serves them.
SERVED_FP8 = _served(moe=False, fp8=True) + _served(moe=True, fp8=True)


def fixture(name: str) -> Path:
    return ROOT / name


def quant_config(name: str) -> dict:
    return json.loads((fixture(name) / "config.json").read_text())["quantization_config"]


def checkpoint_keys(name: str) -> set[str]:
    from safetensors import safe_open

    with safe_open(fixture(name) / "model.safetensors", "pt") as f:
        return set(f.keys())


def splits_gate_up(name: str) -> bool:
    """gptqmodel 7.7.0 saves Phi-3's fused mlp.gate_up_proj as separate gate_proj and up_proj
    (tests/quant_fixtures/README.md); reference/, a transformers checkpoint, keeps it fused."""
    ref = json.loads((fixture(name) / "reference" / "config.json").read_text())
    return "Phi3ForCausalLM" in ref.get("architectures", []) and any(
        k.endswith(".mlp.gate_proj.qweight") for k in checkpoint_keys(name)
    )


def reference_weights(name: str) -> dict[str, torch.Tensor]:
    """reference/'s tensors, plus, where the quantized checkpoint splits a module that
    reference/ fuses (gptqmodel's Phi-3 gate_proj / up_proj), each split module's half of the
    fused weight under the checkpoint's name, and where transformers saved Mixtral's experts
    under the Hub's names (block_sparse_moe.experts.{e}.w1 ...), each also under the
    checkpoint's (gptqmodel's mlp.experts.{e}.gate_proj ...): every quantized module has its
    `.weight`."""
    from safetensors.torch import load_file

    ref = load_file(fixture(name) / "reference" / "model.safetensors")
    for key in [k for k in ref if ".block_sparse_moe.experts." in k]:  # Mixtral's, as the Hub
        head, leaf, _ = key.rsplit(".", 2)  # names them; the checkpoint says mlp.experts.{e}...
        module = head.replace(".block_sparse_moe.experts.", ".mlp.experts.")
        ref[f"{module}.{MLP_EXPERT_LEAVES[leaf]}.weight"] = ref[key]
    if splits_gate_up(name):
        for key in [k for k in ref if k.endswith(".mlp.gate_up_proj.weight")]:
            gate, up = ref[key].chunk(2)
            ref[key.replace(".gate_up_proj.", ".gate_proj.")] = gate.contiguous()
            ref[key.replace(".gate_up_proj.", ".up_proj.")] = up.contiguous()
    return ref


def weights_at(path: Path, rank: int = 0, world: int = 1, dtype=torch.float32) -> Weights:
    from shard.models.config import read_quantization

    return Weights(
        path,
        dtype=dtype,
        device=CPU,
        dist=Distributed(rank=rank, world_size=world),
        quantization=read_quantization(path),
    )
