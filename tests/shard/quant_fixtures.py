"""The int4 checkpoints under tests/quant_fixtures/, made by the formats' own tools (see its
README): each has a `reference/` twin, the same model dequantized by that tool's library."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from shard.distributed import Distributed
from shard.weights import Weights

ROOT = Path(__file__).resolve().parents[1] / "quant_fixtures"
# Every fixture we serve (8-bit GPTQ is refused by name; tests/shard/test_quantized_errors.py).
SERVED = sorted(
    p.name
    for p in ROOT.iterdir()
    if (p / "reference").is_dir()
    and json.loads((p / "config.json").read_text())["quantization_config"].get("bits", 4) == 4
)
CPU = torch.device("cpu")


def fixture(name: str) -> Path:
    return ROOT / name


def quant_config(name: str) -> dict:
    return json.loads((fixture(name) / "config.json").read_text())["quantization_config"]


def reference_weights(name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(fixture(name) / "reference" / "model.safetensors")


def weights_at(path: Path, rank: int = 0, world: int = 1, dtype=torch.float32) -> Weights:
    from shard.models.config import read_quantization

    return Weights(
        path,
        dtype=dtype,
        device=CPU,
        dist=Distributed(rank=rank, world_size=world),
        quantization=read_quantization(path),
    )
