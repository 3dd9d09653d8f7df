"""`quantization_config` from config.json, parsed once into what the loaders and checks need.

Torch-free on purpose: the launcher reads it too, to refuse a wrong `--quantize` or
`--num-shard` before it spawns anything.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any

# The names `--quantize` takes, as checkpoints spell `quant_method` ("fp8": transformers'
# fine-grained FP8 and AutoFP8; compressed-tensors FP8 is "compressed-tensors").
METHODS = ("awq", "gptq", "compressed-tensors", "fp8", "mxfp4")
# Formats whose quantized tensors are Mixture-of-Experts experts only (gpt-oss's MXFP4, which
# the experts' reader dequantizes at load: shard/layers/moe_interleaved.py); every linear of
# such a checkpoint is floating point.
EXPERTS_ONLY_METHODS = ("mxfp4",)
# 8-bit checkpoints would need a second packed layout; they are refused by name for now.
_SUPPORTED_BITS = {"awq": (4,), "gptq": (4,), "compressed-tensors": (4,)}


class QuantizationConfigError(ValueError):
    """The checkpoint's quantization_config names something we cannot load; says which field."""


@dataclass(frozen=True)
class QuantizationConfig:
    method: str  # one of METHODS
    bits: int
    group_size: int  # input rows per scale; -1: one scale per output channel (whole input)
    # Asymmetric (integer zero points stored in the checkpoint) or symmetric (zero = 2^(bits-1)).
    zero_point: bool
    desc_act: bool = False  # GPTQ act-order: each input row's group comes from g_idx
    # GPTQ: "gptq" stores zero points minus one (the original AutoGPTQ quirk); "gptq_v2" does not.
    checkpoint_format: str = "gptq"
    # Modules left in floating point: exact names or "re:" patterns (compressed-tensors `ignore`,
    # GPTQ `modules_to_not_convert`; AWQ's substrings and GPTQ `dynamic`'s `-:` rules are turned
    # into patterns).
    ignore: tuple[str, ...] = ()
    # "int": integer codes with scales (and zero points); "fp8": float8_e4m3fn weights with float
    # scales (shard/layers/quant/fp8.py).
    weight_type: str = "int"
    # FP8 only: the (output, input) features that share one scale when the checkpoint says so
    # (transformers' weight_block_size, compressed-tensors' block_structure); None where the
    # scale tensor's shape tells per-tensor from per-channel.
    block: tuple[int, int] | None = None
    # FP8 only: how the checkpoint's producer quantized activations (e.g. "dynamic per token"),
    # which our W8A16 kernels do not do: they keep activations in the model's dtype.
    activations: str | None = None
    # FP8 only: quantized at load from a floating-point checkpoint (`--quantize fp8`), not read
    online: bool = False

    @property
    def int4_linears(self) -> bool:
        """Whether the checkpoint's linears are int4 (AWQ, GPTQ, compressed-tensors), which
        the int4 kernels serve; not for a format of experts only, nor for FP8."""
        return self.method not in EXPERTS_ONLY_METHODS and self.weight_type == "int"

    @property
    def fp8(self) -> bool:
        return self.weight_type == "fp8"

    @property
    def pack_factor(self) -> int:
        return 32 // self.bits

    def quantizes(self, prefix: str) -> bool:
        """Whether the checkpoint module `prefix` (e.g. model.layers.0.mlp.down_proj) is
        quantized; ignored modules load as plain floating-point linears."""
        for pattern in self.ignore:
            if pattern.startswith("re:"):
                if re.fullmatch(pattern[3:], prefix):
                    return False
            elif prefix == pattern or prefix.endswith(f".{pattern}"):
                return False
        return True

    def row_split_ok(self, in_features: int, num_shard: int) -> bool:
        """Whether a row-parallel layer of `in_features` inputs splits on group boundaries
        (and on whole packed int32 words) across `num_shard` shards."""
        if in_features % num_shard:
            return False
        per_shard = in_features // num_shard
        if self.fp8:  # any cut: FP8 scales are re-blocked at a cut inside a block (fp8.py)
            return True
        # Per-channel scales (group_size -1) hold for every input row, so any cut works.
        group = self.pack_factor if self.group_size == -1 else self.group_size
        return per_shard % group == 0 and per_shard % self.pack_factor == 0


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


def module_names(raw: dict[str, Any], *fields: str) -> tuple[str, ...]:
    """The first of `fields` that the config sets: a list of module names or patterns."""
    value = next((raw[f] for f in fields if raw.get(f)), ())
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        raise QuantizationConfigError(
            f"quantization_config.{fields[0]} must be a list of module names"
        )
    return tuple(value)


def _glob_and_below(pattern: str) -> str:
    """A shell-style module pattern as an `ignore` regex matching the module and its children."""
    module = fnmatch.translate(pattern).removesuffix(r"\Z")  # (?s:...) without its end anchor
    return f"re:{module}(?:\\..*)?"


def one_scheme(raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """compressed-tensors' single config group: (its path for messages, its scheme)."""
    groups = raw.get("config_groups") or {}
    if not isinstance(groups, dict) or len(groups) != 1:
        raise QuantizationConfigError(
            f"quantization_config.config_groups has {len(groups)} groups; exactly one "
            "(one scheme for every quantized linear) is supported"
        )
    ((name, scheme),) = groups.items()
    if not isinstance(scheme, dict):
        raise QuantizationConfigError(f"quantization_config.config_groups.{name} is not an object")
    return f"quantization_config.config_groups.{name}", scheme


def check_targets(scheme: dict[str, Any], where: str) -> None:
    targets = scheme.get("targets") or []
    if targets != ["Linear"]:
        raise QuantizationConfigError(
            f"{where}.targets = {targets!r}: only ['Linear'] is supported"
        )


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
        ignore=tuple(raw.get("ignore") or ()),
    )


# Placed last: config_fp8 imports this module's names.
from shard.layers.quant.config_fp8 import (  # noqa: E402
    FLOAT_FORMATS,
    compressed_tensors_fp8,
    transformers_fp8,
)
