"""FP8 checkpoints' `quantization_config`: transformers' fine-grained FP8 (`quant_method: fp8`,
Qwen's and DeepSeek's releases, 128 x 128 blocks), AutoFP8's (`fp8` without blocks: per-tensor
scales) and compressed-tensors' `float-quantized` (llm-compressor's FP8_DYNAMIC, FP8 and
FP8_BLOCK schemes). Weights are float8_e4m3fn with float scales; what the scales cover (a block,
an output channel, the whole tensor) is read from the config and the scale tensor's shape
(shard/layers/quant/fp8.py).

Activations: every one of these formats may ask for FP8 activations (dynamic per token or per
group, or static with an `input_scale`). The kernels here are weight-only (W8A16: the weight is
scaled into the model's dtype, the activations stay in it), as vLLM runs FP8 checkpoints on GPUs
without FP8 tensor cores; the scheme is kept in `QuantizationConfig.activations` for the log.
"""

from __future__ import annotations

import re
from typing import Any

from shard.layers.quant.config_types import (
    QuantizationConfig,
    QuantizationConfigError,
    check_targets,
    compressed_tensors_ignore,
    module_names,
    one_scheme,
)

# compressed-tensors formats whose FP8 weights are stored as float8 values with their scales
FLOAT_FORMATS = ("float-quantized", "naive-quantized")
# transformers' FineGrainedFP8Config default, used when a config with weight_scale_inv tensors
# leaves weight_block_size out
DEFAULT_BLOCK = (128, 128)


def transformers_fp8(raw: dict[str, Any]) -> QuantizationConfig:
    fmt = raw.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise QuantizationConfigError(
            f"quantization_config.fmt = {fmt!r}: only e4m3 FP8 weights are supported"
        )
    scheme = raw.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise QuantizationConfigError(
            f"quantization_config.activation_scheme = {scheme!r}: 'dynamic' or 'static'"
        )
    if raw.get("expert_dtype", "fp8") != "fp8":
        raise QuantizationConfigError(
            f"quantization_config.expert_dtype = {raw['expert_dtype']!r}: only FP8 experts "
            "are supported"
        )
    if raw.get("modules_to_convert"):
        raise QuantizationConfigError(
            "quantization_config.modules_to_convert is not supported (only "
            "modules_to_not_convert, which leaves modules in floating point)"
        )
    block = raw.get("weight_block_size", DEFAULT_BLOCK)
    # MiniMax's and AutoFP8's name for the modules left in floating point
    skipped = module_names(raw, "modules_to_not_convert", "ignored_layers")
    return QuantizationConfig(
        method="fp8",
        bits=8,
        group_size=-1,
        zero_point=False,
        ignore=tuple(p for name in skipped for p in _transformers_skip(name)),
        weight_type="fp8",
        block=None if block is None else _block(block, "quantization_config.weight_block_size"),
        activations=f"{scheme} per {'group' if block is not None else 'tensor'}",
    )


def _transformers_skip(name: str) -> tuple[str, ...]:
    """transformers' `should_convert_module` patterns as `ignore` regexes: the name as a regex
    from the start of a module's name up to a dot or the end (so "layers.1" is not "layers.11"),
    or as a plain suffix."""
    try:
        re.compile(name)
        prefix: tuple[str, ...] = (f"re:(?:{name})(?:(?<=\\.)|(?=\\.|$)).*",)
    except re.error:  # not a regex: the suffix rule alone applies
        prefix = ()
    return (*prefix, f"re:.*{re.escape(name)}")


def compressed_tensors_fp8(raw: dict[str, Any]) -> QuantizationConfig:
    where, scheme = one_scheme(raw)
    check_targets(scheme, where)
    weights = scheme.get("weights") or {}
    if weights.get("type") != "float" or weights.get("num_bits") != 8:
        raise QuantizationConfigError(
            f"{where}.weights: type {weights.get('type')!r}, num_bits "
            f"{weights.get('num_bits')!r}: the {raw.get('format')} format is served for 8-bit "
            "float (FP8) weights only"
        )
    if not weights.get("symmetric", True) or weights.get("dynamic", False):
        raise QuantizationConfigError(
            f"{where}.weights: only symmetric FP8 weights with stored scales are supported"
        )
    strategy = weights.get("strategy")
    block = None
    if strategy == "block":
        block = _block(weights.get("block_structure"), f"{where}.weights.block_structure")
    elif strategy not in ("tensor", "channel"):
        raise QuantizationConfigError(
            f"{where}.weights.strategy = {strategy!r}: FP8 weights are supported per tensor, "
            "per channel or in blocks"
        )
    if scheme.get("output_activations"):
        raise QuantizationConfigError(f"{where}.output_activations: not supported")
    inputs = scheme.get("input_activations")
    activations = None
    if inputs:
        if inputs.get("type") != "float" or inputs.get("num_bits") != 8:
            raise QuantizationConfigError(
                f"{where}.input_activations: only FP8 activations (which the weight-only "
                "kernels keep in the model's dtype) are supported with FP8 weights"
            )
        kind = "dynamic" if inputs.get("dynamic") else "static"
        activations = f"{kind} per {inputs.get('strategy')}"
    return QuantizationConfig(
        method="compressed-tensors",
        bits=8,
        group_size=-1,
        zero_point=False,
        ignore=compressed_tensors_ignore(raw),
        weight_type="fp8",
        block=block,
        activations=activations,
    )


def _block(value: Any, field: str) -> tuple[int, int]:
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and v > 0 for v in value)
    ):
        raise QuantizationConfigError(
            f"{field} = {value!r}: expected [output features, input features] per scale"
        )
    return int(value[0]), int(value[1])


# `--quantize fp8` on a floating-point checkpoint: each linear quantized at load as transformers'
# FineGrainedFP8 quantizes on load (shard/layers/quant/fp8_online.py), lm_head left as it is.
ONLINE_FP8 = QuantizationConfig(
    method="fp8",
    bits=8,
    group_size=-1,
    zero_point=False,
    ignore=("lm_head",),
    weight_type="fp8",
    block=DEFAULT_BLOCK,
    online=True,
)
