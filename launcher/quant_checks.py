"""Checks of the checkpoint's quantization against `--quantize` and `--num-shard`, before any
shard is spawned: a mismatch would otherwise surface as a loader error in every shard's log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.checks import _dense_reason, _experts, _positive
from shard.layers.quant.config import (
    QuantizationConfig,
    QuantizationConfigError,
    parse_quantization_config,
)

PACK_OUTPUTS = 8  # int4 zero points (and AWQ's codes) pack 8 output features per int32


class QuantizationCheckError(ValueError):
    pass


def check_quantization(
    quantize: str | None, num_shard: int, model_dir: Path, compiled: bool = False
) -> None:
    """Raises QuantizationCheckError naming the flag, the checkpoint's value and the fix."""
    config = _read_config(model_dir)
    raw = config.get("quantization_config") or config.get("compression_config")
    try:
        quant = parse_quantization_config(raw)
    except QuantizationConfigError as exc:
        raise QuantizationCheckError(f"{model_dir / 'config.json'}: {exc}") from None
    if quantize is not None and quant is None:
        if quantize == "fp8" and compiled:
            raise QuantizationCheckError(
                "--compile does not support --quantize fp8; leave one of them out"
            )
        if quantize == "fp8":
            return  # the shards quantize it at load (shard/layers/quant/fp8_online.py)
        raise QuantizationCheckError(
            f"--quantize {quantize}: {model_dir} is not a quantized checkpoint (its config.json "
            "has no quantization_config); Switchyard serves AWQ, GPTQ, compressed-tensors, FP8 "
            "and MXFP4 checkpoints as they were saved, and quantizes at load to fp8 only "
            "(--quantize fp8)"
        )
    if quant is None:
        return
    if compiled:  # --compile
        raise QuantizationCheckError(
            f"--compile does not support quantized checkpoints ({model_dir} is {quant.method}); "
            "leave --compile out to serve it"
        )
    if quantize is not None and quantize != quant.method:
        raise QuantizationCheckError(
            f"--quantize {quantize} disagrees with the checkpoint, which is {quant.method} "
            f"(quantization_config.quant_method in {model_dir / 'config.json'}); pass "
            f"--quantize {quant.method} or leave the flag out"
        )
    if not quant.int4_linears:  # experts only (check_experts), or FP8, whose cuts any split
        return
    shapes = config.get("text_config", config)  # multimodal wrappers nest the LM's config
    if not _splits(shapes, quant, num_shard):
        working = [n for n in range(1, 65) if _splits(shapes, quant, n)]
        raise QuantizationCheckError(
            f"--num-shard {num_shard} cannot split this {quant.method} checkpoint: each shard's "
            f"slice of every layer must fall on quantization group boundaries (group_size "
            f"{quant.group_size}) and whole packed words of {PACK_OUTPUTS} outputs; "
            f"--num-shard values that work: {', '.join(map(str, working)) or 'none'}"
        )


def _read_config(model_dir: Path) -> dict[str, Any]:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}  # the shard reports what it cannot read
    return config if isinstance(config, dict) else {}


def _splits(config: dict[str, Any], quant: QuantizationConfig, n: int) -> bool:
    """Whether every quantized tensor-parallel linear of a Llama-family model (or of a
    Mixture-of-Experts one's attention, shared expert and dense layers) splits across n shards."""
    try:
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
        intermediates = _mlp_sizes(config)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return True  # not a shape we know: the shard's loader checks every tensor
    if heads % n or (kv_heads % n and n % kv_heads):
        return False  # launcher/checks.py has already named this problem for --num-shard
    kv_per_shard = max(1, kv_heads // n)
    column_outputs = (
        heads // n * head_dim,
        kv_per_shard * head_dim,
        *(i // n for i in intermediates),
    )
    if any(i % n for i in intermediates) or any(out % PACK_OUTPUTS for out in column_outputs):
        return False
    return quant.row_split_ok(heads * head_dim, n) and all(
        quant.row_split_ok(i, n) for i in intermediates
    )


def _mlp_sizes(config: dict[str, Any]) -> list[int]:
    """The intermediate sizes of the MLPs that quantized tensor-parallel linears hold. Not a
    Mixture-of-Experts model's routed experts: the shard refuses int4 experts at any shard
    count, naming them, and float ones are split as launcher/checks.py check_experts checks.
    So Mixtral's intermediate_size (its experts') is not one; a Qwen-MoE's is where some layers
    stay dense, and its shared expert's shared_expert_intermediate_size is."""
    if _experts(config) is None:
        return [int(config["intermediate_size"])]
    sizes = [_positive(config.get("shared_expert_intermediate_size"))]
    if "moe_intermediate_size" in config and _dense_reason(config):
        sizes.append(_positive(config.get("intermediate_size")))
    return [size for size in sizes if size is not None]
