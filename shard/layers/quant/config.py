"""`quantization_config` from config.json, parsed once into what the loaders and checks need.

Torch-free on purpose: the launcher reads it too, to refuse a wrong `--quantize` or
`--num-shard` before it spawns anything.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from shard.layers.quant.config_fp8 import FLOAT_FORMATS, compressed_tensors_fp8, transformers_fp8
from shard.layers.quant.config_types import (
    QuantizationConfig,
    QuantizationConfigError,
    check_targets,
    compressed_tensors_ignore,
    module_names,
    one_scheme,
)

__all__ = ["METHODS", "QuantizationConfig", "QuantizationConfigError", "parse_quantization_config"]

# The names `--quantize` takes, as checkpoints spell `quant_method` ("fp8": transformers'
# fine-grained FP8 and AutoFP8; compressed-tensors FP8 is "compressed-tensors").
METHODS = ("awq", "gptq", "compressed-tensors", "fp8", "mxfp4")
# 8-bit checkpoints would need a second packed layout; they are refused by name for now.
_SUPPORTED_BITS = {"awq": (4,), "gptq": (4,), "compressed-tensors": (4,)}


def parse_quantization_config(raw: dict[str, Any] | None) -> QuantizationConfig | None:
    """None for an unquantized checkpoint; raises QuantizationConfigError naming the field."""
    if not raw:
        return None
    if not isinstance(raw, dict):
        raise QuantizationConfigError("quantization_config must be an object")
    method = raw.get("quant_method")
    if method == "awq":
        return _awq(raw)
    if method == "gptq":
        return _gptq(raw)
    if method == "compressed-tensors":
        if raw.get("format") in FLOAT_FORMATS:
            return compressed_tensors_fp8(raw)
        return _compressed_tensors(raw)
    if method == "fp8":
        return transformers_fp8(raw)
    if method == "mxfp4":
        return _mxfp4(raw)
    raise QuantizationConfigError(
        f"quantization_config.quant_method {method!r} is not supported; supported: "
        f"{', '.join(METHODS)}"
    )


def _bits(method: str, value: Any, field: str) -> int:
    if value not in _SUPPORTED_BITS[method]:
        raise QuantizationConfigError(
            f"{field} = {value!r} is not supported for {method}; supported: "
            f"{', '.join(map(str, _SUPPORTED_BITS[method]))}"
        )
    return int(value)


def _group_size(value: Any, field: str, bits: int) -> int:
    if value == -1 or value is None:
        return -1
    if not isinstance(value, int) or value <= 0 or value % (32 // bits):
        raise QuantizationConfigError(
            f"{field} = {value!r} is not supported: a positive multiple of {32 // bits} or -1"
        )
    return value


def _awq(raw: dict[str, Any]) -> QuantizationConfig:
    version = str(raw.get("version", "gemm")).lower()
    if version != "gemm":
        raise QuantizationConfigError(
            f"quantization_config.version = {version!r}: only AWQ's 'gemm' checkpoints are "
            "supported (gemv, gemv_fast, marlin and exllama pack their weights differently)"
        )
    bits = _bits("awq", raw.get("bits", raw.get("w_bit")), "quantization_config.bits")
    group = raw.get("group_size", raw.get("q_group_size"))
    group_size = _group_size(group, "quantization_config.group_size", bits)
    if group_size == -1:
        raise QuantizationConfigError("quantization_config.group_size: AWQ needs a group size")
    skipped = raw.get("modules_to_not_convert") or ()
    return QuantizationConfig(
        method="awq",
        bits=bits,
        group_size=group_size,
        zero_point=bool(raw.get("zero_point", True)),
        ignore=tuple(f"re:.*{re.escape(name)}.*" for name in skipped),
    )


def _gptq(raw: dict[str, Any]) -> QuantizationConfig:
    bits = _bits("gptq", raw.get("bits"), "quantization_config.bits")
    fmt = str(raw.get("checkpoint_format") or raw.get("format") or "gptq").lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise QuantizationConfigError(
            f"quantization_config.checkpoint_format = {fmt!r} is not supported "
            "(supported: gptq, gptq_v2)"
        )
    settings = {  # what a positive `dynamic` rule may restate
        "bits": bits,
        "group_size": raw.get("group_size", 128),
        "sym": raw.get("sym", True),
        "desc_act": raw.get("desc_act", False),
    }
    skipped = tuple(raw.get("modules_to_not_convert") or ())
    return QuantizationConfig(
        method="gptq",
        bits=bits,
        group_size=_group_size(settings["group_size"], "quantization_config.group_size", bits),
        # Symmetric GPTQ still stores zero points (all the midpoint); they are read either way.
        zero_point=not settings["sym"],
        desc_act=bool(settings["desc_act"]),
        checkpoint_format=fmt,
        ignore=skipped + _gptq_dynamic(raw.get("dynamic"), settings),
    )


def _gptq_dynamic(rules: Any, settings: dict[str, Any]) -> tuple[str, ...]:
    """gptqmodel's per-module rules as `ignore` patterns. Each key is a regex over module names,
    `-:` (leave the module unquantized), `+:` or no prefix (quantize it with the value's
    overrides). gptqmodel decides a module by the FIRST rule, in order, whose regex matches it
    with `re.match` (anchored at the start only; gptqmodel/quantization/config.py
    `_resolve_dynamic_override`). A `-:` rule therefore becomes `(?:regex).*` for our
    `re.fullmatch`, behind a guard `(?!earlier)` for every positive rule before it (a module
    such a rule matched first is quantized). Positive rules may only restate `settings`: the
    checkpoint has one packed layout for every quantized module."""
    if not rules:
        return ()
    if not isinstance(rules, dict):
        raise QuantizationConfigError("quantization_config.dynamic must be an object")
    ignore: list[str] = []
    earlier: list[str] = []  # the regexes of positive rules so far
    for key, overrides in rules.items():
        where = f"quantization_config.dynamic[{key!r}]"
        regex = key[2:] if key.startswith(("-:", "+:")) else key
        if key.startswith("-:"):
            guards = "".join(f"(?!{p})" for p in earlier)
            ignore.append(_compiled(f"re:{guards}(?:{regex}).*", where))
            continue
        _compiled(regex, where)
        if not isinstance(overrides, dict):
            raise QuantizationConfigError(f"{where} must be an object of settings")
        for field, value in overrides.items():
            if field not in settings:
                raise QuantizationConfigError(
                    f"{where} sets {field} = {value!r}: per-module GPTQ settings are not "
                    "supported (only '-:' rules, which leave modules unquantized, and rules "
                    f"that restate {', '.join(settings)})"
                )
            if value != settings[field]:
                raise QuantizationConfigError(
                    f"{where} sets {field} = {value!r}, but quantization_config.{field} is "
                    f"{settings[field]!r}: per-module GPTQ settings are not supported (one "
                    "packed layout for every quantized module)"
                )
        earlier.append(regex)
    return tuple(ignore)


def _mxfp4(raw: dict[str, Any]) -> QuantizationConfig:
    """gpt-oss's release: its experts in MXFP4 (32 weights a scale), the rest floating point
    (`modules_to_not_convert`, shell-style patterns such as `model.layers.*.self_attn`, each
    matching the module and everything under it)."""
    skipped = module_names(raw, "modules_to_not_convert")
    return QuantizationConfig(
        method="mxfp4",
        bits=4,
        group_size=32,
        zero_point=False,
        ignore=tuple(_glob_and_below(pattern) for pattern in skipped),
    )


def _glob_and_below(pattern: str) -> str:
    """A shell-style module pattern as an `ignore` regex matching the module and its children."""
    module = fnmatch.translate(pattern).removesuffix(r"\Z")  # (?s:...) without its end anchor
    return f"re:{module}(?:\\..*)?"


def _compiled(pattern: str, where: str) -> str:
    try:
        re.compile(pattern.removeprefix("re:"))
    except re.error as exc:
        raise QuantizationConfigError(
            f"{where}: not a regular expression Python reads ({exc})"
        ) from None
    return pattern


def _compressed_tensors(raw: dict[str, Any]) -> QuantizationConfig:
    fmt = raw.get("format")
    if fmt != "pack-quantized":
        raise QuantizationConfigError(
            f"quantization_config.format = {fmt!r}: compressed-tensors 'pack-quantized' "
            f"(W4A16 integer weights) and {' and '.join(map(repr, FLOAT_FORMATS))} (FP8 "
            "weights) are supported"
        )
    where, scheme = one_scheme(raw)
    if scheme.get("input_activations") or scheme.get("output_activations"):
        raise QuantizationConfigError(
            f"{where}: quantized activations are not supported (weight-only W4A16/W8A16 only)"
        )
    check_targets(scheme, where)
    weights = scheme.get("weights") or {}
    if weights.get("type", "int") != "int":
        raise QuantizationConfigError(f"{where}.weights.type = {weights.get('type')!r}: only int")
    bits = _bits("compressed-tensors", weights.get("num_bits"), f"{where}.weights.num_bits")
    strategy = weights.get("strategy")
    if strategy == "group":
        group_size = _group_size(weights.get("group_size"), f"{where}.weights.group_size", bits)
        if group_size == -1:
            raise QuantizationConfigError(f"{where}.weights.group_size is missing")
    elif strategy == "channel":
        group_size = -1
    else:
        raise QuantizationConfigError(
            f"{where}.weights.strategy = {strategy!r}: only 'group' and 'channel' are supported"
        )
    if weights.get("actorder") not in (None, False, "static", "weight"):
        raise QuantizationConfigError(
            f"{where}.weights.actorder = {weights.get('actorder')!r} is not supported"
        )
    return QuantizationConfig(
        method="compressed-tensors",
        bits=bits,
        group_size=group_size,
        zero_point=not weights.get("symmetric", True),
        ignore=compressed_tensors_ignore(raw),
    )
