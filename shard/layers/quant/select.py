"""Which LinearMethod loads a checkpoint module: the checkpoint's quantization, unless the
module is one it leaves in floating point (lm_head, an `ignore` entry)."""

from __future__ import annotations

from collections.abc import Sequence

from shard.layers.quant.awq import AwqReader
from shard.layers.quant.base import LinearMethod
from shard.layers.quant.compressed_tensors import CompressedTensorsReader
from shard.layers.quant.config import QuantizationConfig
from shard.layers.quant.fp8_linear import Fp8Method, MixedFp8Method
from shard.layers.quant.fp8_source import is_fp8
from shard.layers.quant.gptq import GptqReader
from shard.layers.quant.int4_linear import FormatReader, Int4Method
from shard.layers.quant.unquantized import UnquantizedMethod
from shard.weights import Weights, WeightsError

UNQUANTIZED = UnquantizedMethod()


def _reader(config: QuantizationConfig) -> FormatReader:
    if config.method == "awq":
        return AwqReader(config.group_size)
    if config.method == "gptq":
        v1 = config.checkpoint_format == "gptq"
        return GptqReader(config.group_size, config.desc_act, v1_zeros=v1)
    return CompressedTensorsReader(config.group_size, config.zero_point)


def _quantized(weights: Weights, config: QuantizationConfig, prefix: str) -> bool:
    """Whether module `prefix` is served quantized: int4 formats replace its `weight` with
    packed tensors; FP8 keeps the name and adds a scale, or is quantized at load."""
    if config.fp8:
        return is_fp8(weights, prefix)
    return config.quantizes(prefix) and not weights.has(f"{prefix}.weight")


def linear_method(weights: Weights, prefixes: Sequence[str]) -> LinearMethod:
    """The method for a layer loaded from `prefixes` (several for fused layers, which must
    agree: one matmul cannot mix a quantized and a float weight)."""
    config = weights.quantization
    if config is None:
        return UNQUANTIZED
    quantized = {p: _quantized(weights, config, p) for p in prefixes}
    if all(quantized.values()):
        if config.fp8:
            return Fp8Method(config)
        if not config.int4_linears:
            raise WeightsError(
                f"{config.method} linears are not supported: {', '.join(prefixes)} is stored "
                f"in {config.method}, which is served for Mixture-of-Experts experts only"
            )
        return Int4Method(_reader(config), config)
    if not any(quantized.values()):
        return UNQUANTIZED
    if config.fp8:  # FP8 pieces can be dequantized to join floating-point ones
        return MixedFp8Method(config)
    raise WeightsError(
        f"fused layer mixes quantized and floating-point modules: {quantized}; it cannot run "
        "as one matmul"
    )
