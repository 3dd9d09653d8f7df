"""A PEFT LoRA adapter as users have it: adapter_config.json + adapter_model.safetensors.

Read whole into host memory once; the manager slices it per rank when it fills a device slot.
Everything we cannot apply exactly is refused here, naming the adapter and the reason: serving
a request with part of its adapter silently dropped would be the base-model fallback again.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

# PEFT's names for the projections our Llama-family linears hold.
SUPPORTED_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")


class AdapterError(ValueError):
    """The adapter cannot be served; the message names it and says why."""


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    rank: int
    scaling: float  # lora_alpha / r, or lora_alpha / sqrt(r) with rslora
    # Checkpoint module prefix (e.g. model.layers.0.self_attn.q_proj) -> (A [r, in], B [out, r]).
    modules: Mapping[str, tuple[torch.Tensor, torch.Tensor]]


def read_adapter(
    name: str,
    path: Path,
    *,
    max_rank: int,
    module_shapes: Mapping[str, tuple[int, int]],
) -> LoraAdapter:
    """`module_shapes`: the served model's LoRA-capable modules -> (in_features, out_features)."""
    config = _read_config(name, path)
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"adapter {name!r}: r = {rank!r} is not a positive integer")
    if rank > max_rank:
        raise AdapterError(
            f"adapter {name!r}: rank {rank} exceeds --max-lora-rank {max_rank}; restart with "
            f"--max-lora-rank {rank} or more"
        )
    _refuse_unsupported(name, config)
    alpha = config.get("lora_alpha", 8)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    tensors = _read_tensors(name, path)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(f"adapter {name!r}: tensor {key!r} is not a LoRA A/B weight")
        pairs.setdefault(match["module"], {})[match["ab"]] = value
    modules = {}
    for module, ab in sorted(pairs.items()):
        if module not in module_shapes:
            leaf = module.rsplit(".", 1)[-1]
            raise AdapterError(
                f"adapter {name!r}: module {module!r} ({leaf}) cannot take a LoRA here; "
                f"supported: {', '.join(SUPPORTED_TARGETS)}"
            )
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"adapter {name!r}: {module} lacks lora_{'AB'[('A' in ab)]}")
        a, b = ab["A"], ab["B"]
        in_features, out_features = module_shapes[module]
        if a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise AdapterError(
                f"adapter {name!r}: {module} has A {list(a.shape)} and B {list(b.shape)}, but "
                f"the served model needs A [{rank}, {in_features}] and B [{out_features}, {rank}] "
                "(an adapter for another base model?)"
            )
        modules[module] = (a.float(), b.float())
    if not modules:
        raise AdapterError(f"adapter {name!r}: no LoRA weights in {path}")
    return LoraAdapter(name=name, rank=rank, scaling=float(scaling), modules=modules)


def _read_config(name: str, path: Path) -> dict:
    file = path / "adapter_config.json"
    try:
        config = json.loads(file.read_text())
    except OSError as exc:
        raise AdapterError(f"adapter {name!r}: cannot read {file}: {exc.strerror}") from None
    except ValueError as exc:
        raise AdapterError(f"adapter {name!r}: {file} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"adapter {name!r}: {file} is not a JSON object")
    return config


def _refuse_unsupported(name: str, config: dict) -> None:
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"adapter {name!r}: peft_type {config['peft_type']!r} is not LoRA")
    reasons = {
        "use_dora": "DoRA adapters are not supported",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D-style) weights are not supported",
        "modules_to_save": "modules_to_save (fully trained extra modules) are not supported",
        "rank_pattern": "per-module ranks (rank_pattern) are not supported",
        "alpha_pattern": "per-module alphas (alpha_pattern) are not supported",
    }
    for field, reason in reasons.items():
        if config.get(field):
            raise AdapterError(f"adapter {name!r}: {reason} ({field} = {config[field]!r})")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"adapter {name!r}: trained biases (bias = {config['bias']!r})")
    targets = config.get("target_modules")
    if isinstance(targets, list):
        unknown = [t for t in targets if t.rsplit(".", 1)[-1] not in SUPPORTED_TARGETS]
        if unknown:
            raise AdapterError(
                f"adapter {name!r}: target_modules {unknown} cannot take a LoRA here; "
                f"supported: {', '.join(SUPPORTED_TARGETS)}"
            )


def _read_tensors(name: str, path: Path) -> dict[str, torch.Tensor]:
    safetensors = path / "adapter_model.safetensors"
    if safetensors.exists():
        from safetensors.torch import load_file

        try:
            return load_file(safetensors)
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file; the shard serves on
            raise AdapterError(
                f"adapter {name!r}: {safetensors} is not a readable safetensors file "
                f"({type(exc).__name__}: {exc})"
            ) from None
    pickled = path / "adapter_model.bin"
    if pickled.exists():
        try:  # only plain tensors: never unpickle arbitrary objects
            return torch.load(pickled, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any refusal means the same to the user
            raise AdapterError(
                f"adapter {name!r}: {pickled} does not load with weights_only=True ({exc})"
            ) from None
    raise AdapterError(f"adapter {name!r}: no adapter_model.safetensors or .bin in {path}")
