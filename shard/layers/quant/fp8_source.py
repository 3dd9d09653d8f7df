"""Where a module's FP8 weight comes from: the checkpoint's FP8 tensors and scales (fp8.py's
reader), or, with `--quantize fp8` on a floating-point checkpoint, its weight quantized at load
(fp8_online.py)."""

from __future__ import annotations

import torch

from shard.layers.quant.config import QuantizationConfig
from shard.layers.quant.fp8 import Fp8Reader, scale_name
from shard.layers.quant.fp8_online import OnlineFp8Reader, quantizable
from shard.layers.quant.reader import FeatureRange
from shard.weights import Weights


def is_fp8(weights: Weights, prefix: str) -> bool:
    """Whether module `prefix` is served in FP8: stored so (its weight has a scale), or, with
    `--quantize fp8` on a floating-point checkpoint, quantized at load (fp8_online.py)."""
    config = weights.quantization
    if config is None or not config.fp8 or not config.quantizes(prefix):
        return False
    if config.online:
        return quantizable(weights, prefix, config)
    return scale_name(weights, prefix) is not None


def read_dequantized(
    weights: Weights, prefix: str, rows: FeatureRange, cols: FeatureRange
) -> torch.Tensor:
    """Outputs `rows`, inputs `cols` of FP8 module `prefix` in the model's dtype, for layers
    that keep floating-point weights (Mixture-of-Experts experts)."""
    assert weights.quantization is not None
    return (
        fp8_reader(weights.quantization).read(weights, prefix, rows, cols).dequantize(weights.dtype)
    )


def fp8_reader(config: QuantizationConfig) -> Fp8Reader:
    """The checkpoint's FP8 tensors, or (`--quantize fp8`) its floating-point ones quantized."""
    if config.online:
        return OnlineFp8Reader(config)
    return Fp8Reader(config)
