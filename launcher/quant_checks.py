"""Checks of the checkpoint's quantization against `--quantize` and `--num-shard`, before any
shard is spawned: a mismatch would otherwise surface as a loader error in every shard's log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.checks import _dense_reason, _expert_intermediate, _experts, _positive
from shard.layers.quant.config import (
    QuantizationConfig,
    QuantizationConfigError,
    parse_quantization_config,
)

PACK_OUTPUTS = 8  # int4 zero points (and AWQ's codes) pack 8 output features per int32


class QuantizationCheckError(ValueError):
    pass


# A routed expert's module as most checkpoints name it: what a config's `dynamic` or `ignore`
# rules are asked about (gptqmodel's MoE recipe leaves `.*\.experts\..*` in floating point)
EXPERT_MODULE = "model.layers.0.mlp.experts.0.gate_proj"


def check_quantization(
    quantize: str | None,
    num_shard: int,
    model_dir: Path,
    compiled: bool = False,
    expert_parallel: bool = False,
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
    # int4 experts split by their intermediate size, unless each shard holds whole experts
    split_experts = not expert_parallel and quant.quantizes(EXPERT_MODULE)
    if not _splits(shapes, quant, num_shard, split_experts):
        working = [n for n in range(1, 65) if _splits(shapes, quant, n, split_experts)]
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


def _splits(config: dict[str, Any], quant: QuantizationConfig, n: int, split_experts: bool) -> bool:
    """Whether every quantized tensor-parallel linear of a Llama-family model (or of a
    Mixture-of-Experts one's attention, shared expert and dense layers, and its experts where
    `split_experts`) splits across n shards."""
    try:
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
        intermediates = _mlp_sizes(config, split_experts)
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


def _mlp_sizes(config: dict[str, Any], split_experts: bool) -> list[int]:
    """The intermediate sizes of the MLPs that quantized tensor-parallel linears hold: a dense
    model's; a Mixture-of-Experts model's dense layers (a Qwen-MoE's intermediate_size where
    some layers stay dense), its shared expert's (shared_expert_intermediate_size), and with
    `split_experts` (int4 experts, tensor parallel) its routed experts' (moe_intermediate_size,
    or Mixtral's intermediate_size). Floating-point experts are split as launcher/checks.py
    check_experts checks."""
    if _experts(config) is None:
        return [int(config["intermediate_size"])]
    sizes = [_positive(config.get("shared_expert_intermediate_size"))]
    experts = _expert_intermediate(config)
    if split_experts and experts is not None:
        sizes.append(experts[1])
    if "moe_intermediate_size" in config and _dense_reason(config):
        sizes.append(_positive(config.get("intermediate_size")))
    return [size for size in sizes if size is not None]
