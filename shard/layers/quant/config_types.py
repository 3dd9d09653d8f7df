"""What a checkpoint's `quantization_config` is parsed into, and the parsing helpers the formats'
parsers share (shard/layers/quant/config.py, config_fp8.py). Torch-free, as they are."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Formats whose quantized tensors are Mixture-of-Experts experts only (gpt-oss's MXFP4, which
# the experts' reader dequantizes at load: shard/layers/moe_interleaved.py); every linear of
# such a checkpoint is floating point.
EXPERTS_ONLY_METHODS = ("mxfp4",)


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


def module_names(raw: dict[str, Any], *fields: str) -> tuple[str, ...]:
    """The first of `fields` that the config sets: a list of module names or patterns."""
    value = next((raw[f] for f in fields if raw.get(f)), ())
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        raise QuantizationConfigError(
            f"quantization_config.{fields[0]} must be a list of module names"
        )
    return tuple(value)


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


def compressed_tensors_ignore(raw: dict[str, Any]) -> tuple[str, ...]:
    """compressed-tensors' `ignore` list as our patterns: its "re:" entries match as `re.match`
    does (from the name's start, any tail: compressed-tensors' match_name), which our
    fullmatch reads as the pattern followed by anything."""
    return tuple(
        f"re:(?:{entry[3:]}).*" if entry.startswith("re:") else entry
        for entry in raw.get("ignore") or ()
    )
