"""Model registry: config.json's architecture picks the class; weights are checked after build."""

from __future__ import annotations

from pathlib import Path

import torch

from shard.distributed import Distributed
from shard.models import llama
from shard.models.base import CausalLM
from shard.models.config import ModelConfig, UnsupportedArchitectureError, read_architecture
from shard.weights import Weights

__all__ = ["CausalLM", "ModelConfig", "UnsupportedArchitectureError", "load_model"]

_REGISTRY = {**llama.ARCHITECTURES}
SUPPORTED_ARCHITECTURES = tuple(sorted(_REGISTRY))


def load_model(
    model_dir: Path,
    *,
    dtype: torch.dtype,
    device: torch.device,
    dist: Distributed,
    attention: str = "torch",
) -> CausalLM:
    model_dir = Path(model_dir)
    architecture = read_architecture(model_dir)
    if architecture not in _REGISTRY:
        raise UnsupportedArchitectureError(
            f"architecture {architecture!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    spec = _REGISTRY[architecture]
    config = ModelConfig.load(
        model_dir, qkv_bias_default=spec.qkv_bias_default, qk_norm=spec.qk_norm
    )
    weights = Weights(
        model_dir,
        dtype=dtype,
        device=device,
        dist=dist,
        quantization=config.quantization,
        triton=attention == "triton",
    )
    model = spec.model_cls(config, weights, attention)
    weights.check_all_consumed()
    return model.eval()
