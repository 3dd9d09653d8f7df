"""A PEFT LoRA adapter as users have it: adapter_config.json + adapter_model.safetensors.

Read whole into host memory once; the manager slices it per rank when it fills a device slot.
Everything we cannot apply exactly is refused here, naming the adapter and the reason: serving
a request with part of its adapter silently dropped would be the base-model fallback again.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

# PEFT's names for the projections our Llama-family linears hold. A model's own set comes from
# its checkpoint (`_model_targets`): Phi-3's fuses them into qkv_proj and gate_up_proj.
SUPPORTED_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Initialisations that also change the base weights (PEFT stores an adapter for the residual).
_BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")
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
    resolve: Callable[[str], str | None] = lambda module: module,
) -> LoraAdapter:
    """`module_shapes`: the served model's LoRA-capable modules -> (in_features, out_features).
    `resolve`: an adapter's module name -> the checkpoint's (CausalLM.adapter_module)."""
    config = _read_config(name, path)
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"adapter {name!r}: r = {rank!r} is not a positive integer")
    if config.get("target_parameters"):
        _refuse_moe_parameters(name, config, path, _model_targets(module_shapes))
    _refuse_unsupported(name, config)
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise AdapterError(f"adapter {name!r}: lora_alpha = {alpha!r} is not a number")
    rank_pattern = _pattern(name, config, "rank_pattern")
    alpha_pattern = _pattern(name, config, "alpha_pattern")
    tensors = _served_tensors(_read_tensors(name, path), resolve)
    supported = _model_targets(module_shapes)
    _refuse_unknown_targets(name, config, tensors, supported)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(f"adapter {name!r}: tensor {key!r} is not a LoRA A/B weight")
        pairs.setdefault(match["module"], {})[match["ab"]] = value
    # Per module, as PEFT builds it: its rank and alpha from the patterns, else r and lora_alpha.
    per_module: dict[str, tuple[int, float]] = {}
    for module, ab in sorted(pairs.items()):
        if module not in module_shapes:
            leaf = module.rsplit(".", 1)[-1]
            if moe := _moe_part(module):
                raise AdapterError(_moe_refusal(name, module, moe, supported))
            raise AdapterError(
                f"adapter {name!r}: module {module!r} ({leaf}) cannot take a LoRA here; "
                f"supported: {', '.join(supported)}{_fused_hint([leaf], supported)}"
            )
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"adapter {name!r}: {module} lacks lora_{'AB'[('A' in ab)]}")
        r = _pattern_value(rank_pattern, module, rank)
        a, b = ab["A"], ab["B"]
        in_features, out_features = module_shapes[module]
        if a.dim() == b.dim() == 2 and (a.shape[1], b.shape[0]) == (in_features, out_features):
            if a.shape[0] != r or b.shape[1] != r:
                raise AdapterError(
                    f"adapter {name!r}: {module} has rank {a.shape[0]} (A) and {b.shape[1]} (B), "
                    f"but adapter_config.json gives it rank {r} (r or rank_pattern)"
                )
        if a.shape != (r, in_features) or b.shape != (out_features, r):
            raise AdapterError(
                f"adapter {name!r}: {module} has A {list(a.shape)} and B {list(b.shape)}, but "
                f"the served model needs A [{r}, {in_features}] and B [{out_features}, {r}] "
                "(an adapter for another base model?)"
            )
        module_alpha = _pattern_value(alpha_pattern, module, alpha)
        per_module[module] = (r, _scaling(module_alpha, r, config.get("use_rslora")))
    if not per_module:
        raise AdapterError(f"adapter {name!r}: no LoRA weights in {path}")
    slot_rank = max(r for r, _ in per_module.values())
    if slot_rank > max_rank:
        raise AdapterError(
            f"adapter {name!r}: rank {slot_rank} exceeds --max-lora-rank {max_rank}; restart "
            f"with --max-lora-rank {slot_rank} or more"
        )
    # One scaling per slot: the adapter's own; a module whose rank or alpha differs (or a
    # rank_pattern's smaller rank) gets its ratio folded into B and zero-padded rank columns.
    scaling = _scaling(alpha, rank, config.get("use_rslora")) or 1.0
    modules = {}
    for module, (r, module_scaling) in per_module.items():
        a, b = pairs[module]["A"].float(), pairs[module]["B"].float()
        if module_scaling != scaling:
            b = b * (module_scaling / scaling)
        if r < slot_rank:
            a = torch.nn.functional.pad(a, (0, 0, 0, slot_rank - r))
            b = torch.nn.functional.pad(b, (0, slot_rank - r))
        modules[module] = (a, b)
    return LoraAdapter(name=name, rank=slot_rank, scaling=float(scaling), modules=modules)


def _served_tensors(
    tensors: dict[str, torch.Tensor], resolve: Callable[[str], str | None]
) -> dict[str, torch.Tensor]:
    """The adapter's weights under the checkpoint's module names; those of modules the server
    never runs (a vision tower, for text-only serving) left out: they change nothing here."""
    served = {}
    for key, value in tensors.items():
        match = _KEY.match(key)
        if match is None:
            served[key] = value  # refused by name below
        elif (module := resolve(match["module"])) is not None:
            served[f"base_model.model.{module}.lora_{match['ab']}.weight"] = value
    return served


def _scaling(alpha: float, rank: int, rslora: bool | None) -> float:
    return alpha / math.sqrt(rank) if rslora else alpha / rank


def _pattern(name: str, config: dict, field: str) -> dict:
    pattern = config.get(field) or {}
    if not isinstance(pattern, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for v in pattern.values()
    ):
        raise AdapterError(f"adapter {name!r}: {field} = {pattern!r} is not a map to numbers")
    if field == "rank_pattern" and not all(isinstance(v, int) and v > 0 for v in pattern.values()):
        raise AdapterError(f"adapter {name!r}: rank_pattern {pattern!r} has a non-positive rank")
    return pattern


def _pattern_value(pattern: dict, module: str, default):
    """PEFT's rule for rank_pattern and alpha_pattern: the first key that matches the end of
    the module's name at a dot boundary, as a regular expression."""
    for key, value in pattern.items():
        try:
            if re.match(rf"(.*\.)?({key})$", module):
                return value
        except re.error:
            continue  # not a pattern PEFT could have matched either (it would have raised)
    return default


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
        "modules_to_save": "modules_to_save (fully trained extra modules) are not supported",
        "lora_bias": "trained LoRA biases (lora_bias) are not supported",
        "layer_replication": "layer replication (layer_replication) is not supported",
        "trainable_token_indices": "trainable token embeddings are not supported",
        "target_parameters": "LoRA on parameters (target_parameters) is not supported",
        "alora_invocation_tokens": "activated LoRA (aLoRA) is not supported",
        "use_qalora": "QALoRA adapters are not supported",
        "use_bdlora": "block-diagonal LoRA (use_bdlora) is not supported",
        "arrow_config": "Arrow routing adapters are not supported",
        "kasa_config": "KaSA adapters are not supported",
    }
    # (fan_in_fan_out is served: it says the base weights are Conv1D's, [in, out], as GPT-2's,
    # which PEFT only transposes when it merges; A and B are [r, in] and [out, r] either way)
    for field, reason in reasons.items():
        if config.get(field):
            raise AdapterError(f"adapter {name!r}: {reason} ({field} = {config[field]!r})")
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(_BASE_CHANGING_INITS):
        raise AdapterError(
            f"adapter {name!r}: init_lora_weights = {init!r} trains the adapter on a residual "
            "of the base weights, which PEFT recomputes when it loads it; convert it to a plain "
            "LoRA with save_pretrained(..., path_initial_model_for_weight_conversion=...)"
        )
    if config.get("bias", "none") != "none":
        raise AdapterError(f"adapter {name!r}: trained biases (bias = {config['bias']!r})")


def _model_targets(module_shapes: Mapping[str, tuple[int, int]]) -> tuple[str, ...]:
    """The served model's LoRA-capable module names as PEFT targets them (the last part of each
    checkpoint prefix): q_proj ... down_proj for the Llama family, qkv_proj, o_proj,
    gate_up_proj, down_proj for a checkpoint that fuses them (Phi-3)."""
    leaves = {module.rsplit(".", 1)[-1] for module in module_shapes}
    known = [t for t in (*SUPPORTED_TARGETS, "qkv_proj", "gate_up_proj") if t in leaves]
    return (*known, *sorted(leaves - set(known)))


def _fused_hint(leaves: list[str], supported: tuple[str, ...]) -> str:
    """Why a Llama-style target cannot go on a fused checkpoint, and the other way round: PEFT
    wraps the modules of the model it trains, so such an adapter was made for another model."""
    fused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    hints = []
    for whole, parts in fused.items():
        if whole in supported and any(leaf in parts for leaf in leaves):
            hints.append(f"this checkpoint fuses {'/'.join(parts)} into {whole}")
        elif whole in leaves and whole not in supported:
            hints.append(f"this checkpoint has separate {'/'.join(parts)}")
    return f" ({'; '.join(hints)}: an adapter for another model?)" if hints else ""


def _refuse_unknown_targets(
    name: str, config: dict, tensors: dict[str, torch.Tensor], supported: tuple[str, ...]
) -> None:
    """target_modules entries we cannot apply, when the file holds weights for them. PEFT skips
    entries that match no module of the model it trained (one list written for several
    architectures: c_attn, W_pack...) and saves nothing for them, so the weights decide, as
    in vLLM."""
    targets = config.get("target_modules")
    if not isinstance(targets, list):
        return
    named = {part for key in tensors for part in key.split(".")}
    leaves = [(t, t.rsplit(".", 1)[-1]) for t in targets]
    unknown = [t for t, leaf in leaves if leaf not in supported and leaf in named]
    if unknown:
        unknown_leaves = {t.rsplit(".", 1)[-1] for t in unknown}
        for module in sorted(m["module"] for key in tensors if (m := _KEY.match(key))):
            if module.rsplit(".", 1)[-1] in unknown_leaves and (moe := _moe_part(module)):
                raise AdapterError(_moe_refusal(name, module, moe, supported))
        hint = _fused_hint([t.rsplit(".", 1)[-1] for t in unknown], supported)
        raise AdapterError(
            f"adapter {name!r}: target_modules {unknown} cannot take a LoRA here; "
            f"supported: {', '.join(supported)}{hint}"
        )


def _moe_part(module: str) -> str | None:
    """What an adapter's module is, in the refusal's words, where it is a part of a
    Mixture-of-Experts block we hold outside our tensor-parallel linears: the routed experts
    (the Hub's per-expert `experts.3.gate_proj` / `experts.3.w1`, as PEFT wrote them on
    transformers 4; transformers 5's stacked `experts`), the router (`mlp.gate`, Mixtral's
    `block_sparse_moe.gate`), or Qwen2-MoE's shared-expert gate. The shared expert itself is a
    plain MLP and takes LoRA."""
    parts = [p for p in module.split(".") if p != "base_layer"]  # PEFT's nested ParamWrappers
    if parts[-1] == "experts":
        return "holds the routed experts"
    if "experts" in parts:
        return "is a routed expert"
    if parts[-1] in ("gate", "router") and len(parts) > 1 and parts[-2] in _MOE_BLOCKS:
        return "is the router"
    if parts[-1] == "shared_expert_gate":
        return "is the shared expert's gate"
    return None


_MOE_BLOCKS = ("mlp", "block_sparse_moe")


def _moe_refusal(name: str, module: str, part: str, supported: tuple[str, ...]) -> str:
    return (
        f"adapter {name!r}: module {module!r} {part} of a Mixture-of-Experts block: the "
        "routed experts and the router of a Mixture-of-Experts block (and its shared-expert "
        "gate) take no LoRA adapters here, only the attention projections and dense or "
        f"shared-expert MLPs do; supported: {', '.join(supported)}"
    )


def _refuse_moe_parameters(name: str, config: dict, path: Path, supported: tuple[str, ...]) -> None:
    """PEFT on transformers 5 puts a LoRA on the stacked expert parameters and the router with
    target_parameters (and turns target_modules such as w1 or gate_proj on Mixtral and
    Qwen3-MoE into them): name the Mixture-of-Experts module its weights are for. Any other
    target_parameters adapter (and one in a .bin file, which PEFT does not write for these)
    gets the plain refusal of `_refuse_unsupported`."""
    for module in sorted(m["module"] for key in _tensor_names(path) if (m := _KEY.match(key))):
        if moe := _moe_part(module):
            clean = ".".join(p for p in module.split(".") if p != "base_layer")
            raise AdapterError(
                f"{_moe_refusal(name, clean, moe, supported)} (LoRA on parameters: "
                f"target_parameters = {config['target_parameters']!r})"
            )


def _tensor_names(path: Path) -> list[str]:
    """The adapter's tensor names, read from the safetensors header alone (nothing where there
    is none to read: the tensors' own reading reports that)."""
    try:
        from safetensors import safe_open

        with safe_open(path / "adapter_model.safetensors", "pt") as file:
            return list(file.keys())
    except Exception:  # noqa: BLE001 - a missing or foreign file is refused when it is read
        return []


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
