"""Loading a model: config.json's architecture picks the class through the registry; its
config is mapped by the class, its weights read by its blocks and checked after the build."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from shard.distributed import Distributed
from shard.layers.quant.config_fp8 import ONLINE_FP8
from shard.models.base import CausalLM
from shard.models.config import (
    ModelConfig,
    UnsupportedArchitectureError,
    read_architecture,
    read_config_dict,
    read_eos_token_ids,
    read_quantization,
)
from shard.models.registry import ARCHITECTURES, SUPPORTED_ARCHITECTURES, model_class
from shard.weights import Weights

__all__ = [
    "CausalLM",
    "ModelConfig",
    "SUPPORTED_ARCHITECTURES",
    "UnsupportedArchitectureError",
    "load_config",
    "load_model",
]


log = logging.getLogger(__name__)


def load_config(model_dir: Path) -> ModelConfig:
    """The checkpoint's config as its architecture maps it."""
    model_dir = Path(model_dir)
    architecture = read_architecture(model_dir)
    if architecture not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"architecture {architecture!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    raw = read_config_dict(model_dir)
    return model_class(architecture).config_from_dict(
        raw,
        architecture=architecture,
        eos_token_ids=read_eos_token_ids(model_dir, raw),
        quantization=read_quantization(model_dir),
    )


def load_model(
    model_dir: Path,
    *,
    dtype: torch.dtype,
    device: torch.device,
    dist: Distributed,
    attention: str = "torch",
    expert_parallel: bool = False,
    quantize: str | None = None,
) -> CausalLM:
    """`quantize` "fp8" on a floating-point checkpoint quantizes its linears at load
    (shard/layers/quant/fp8_online.py); otherwise the checkpoint's own quantization is used."""
    model_dir = Path(model_dir)
    config = load_config(model_dir)
    quantization = config.quantization
    if quantization is None and quantize == "fp8":
        quantization = ONLINE_FP8
    if expert_parallel and config.moe is None:
        raise UnsupportedArchitectureError(
            f"--expert-parallel needs a Mixture-of-Experts model; {config.architecture} in "
            f"{model_dir} has no experts"
        )
    weights = Weights(
        model_dir,
        dtype=dtype,
        device=device,
        dist=dist,
        quantization=quantization,
        triton=attention == "triton",
        expert_parallel=expert_parallel,
    )
    model = model_class(config.architecture)(config, weights, attention)
    if quantization is not None and weights.skip_kv_cache_scales():
        log.info(
            "the checkpoint's FP8 KV-cache scales are not used: the KV cache stays in %s", dtype
        )
    weights.check_all_consumed()
    return model.eval()
