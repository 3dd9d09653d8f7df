"""Checks of `--num-shard` against the machine and the model, before any shard is spawned.

Each mistake caught here would otherwise surface minutes later, deep inside N shard logs (a CUDA
"invalid device ordinal", a loader error on one rank, a rendezvous that never completes).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.devices import visible_gpu_count


class ShardCountError(ValueError):
    """`--num-shard` cannot work on this machine or for this model (with or without
    `--expert-parallel`, which decides how a Mixture-of-Experts model's experts are split)."""


def check_num_shard(
    num_shard: int,
    model_dir: Path,
    cuda_visible_devices: str | None,
    count_gpus: Callable[[str | None], int] = visible_gpu_count,
) -> None:
    """Raises ShardCountError with a message that names --num-shard, N and the limit."""
    if num_shard > 1:  # one shard always fits: on the only GPU, or on the CPU
        gpus = count_gpus(cuda_visible_devices)
        if gpus and num_shard > gpus:
            raise ShardCountError(
                f"--num-shard {num_shard} needs one GPU per shard, but only {gpus} GPU(s) are "
                f"visible (CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}); pass --num-shard "
                f"{gpus} or fewer"
            )
    heads, kv_heads = _head_counts(model_dir)
    if heads is not None and heads % num_shard:
        raise ShardCountError(
            f"--num-shard {num_shard} does not divide the model's {heads} attention heads "
            f"(num_attention_heads in {model_dir / 'config.json'}); each shard must hold a "
            f"whole number of heads: pass one of {_divisors(heads)}"
        )
    config = _text_config(model_dir) or {}
    _check_layer_heads(num_shard, config, model_dir / "config.json")
    linear_heads = _positive(config.get("linear_num_key_heads"))
    if linear_heads is not None and linear_heads % num_shard:
        raise ShardCountError(
            f"--num-shard {num_shard} does not divide the model's {linear_heads} linear-attention "
            f"key heads (linear_num_key_heads in {model_dir / 'config.json'}): pass one of "
            f"{_divisors(linear_heads)}"
        )
    _check_mamba_heads(num_shard, config, model_dir / "config.json")
    _check_mamba1_channels(num_shard, config, model_dir / "config.json")
    _check_kda_heads(num_shard, config, model_dir / "config.json")
    if kv_heads is not None and kv_heads % num_shard and num_shard % kv_heads:
        # KV heads split across shards, or, when there are fewer of them, are replicated.
        raise ShardCountError(
            f"--num-shard {num_shard} cannot share the model's {kv_heads} key/value heads "
            f"(num_key_value_heads): it must divide {kv_heads} or be a multiple of it"
        )


def _check_layer_heads(num_shard: int, config: dict, path: Path) -> None:
    """Laguna's query heads, a count a layer (num_attention_heads_per_layer): each layer's
    split across the shards."""
    counts = _layer_heads(config)
    for layer, heads in enumerate(counts):
        if heads % num_shard:
            every = math.gcd(*counts)
            raise ShardCountError(
                f"--num-shard {num_shard} does not divide the {heads} attention heads of layer "
                f"{layer} (num_attention_heads_per_layer in {path}); each shard must hold a "
                f"whole number of every layer's heads: pass one of {_divisors(every)}"
            )


def _layer_heads(config: dict[str, Any]) -> list[int]:
    """The query heads of each layer where the config counts them a layer (Laguna's), or []."""
    counts = config.get("num_attention_heads_per_layer")
    if not isinstance(counts, list):
        return []
    return [h for h in map(_positive, counts) if h is not None]


def _check_mamba_heads(num_shard: int, config: dict, path: Path) -> None:
    """A Mamba 2 mixer's heads split across the shards; its groups (whose heads share B and C)
    split too, or, when there are fewer of them, each shard reads its heads' group. Granite 4.0,
    Bamba and Falcon-H1 name the fields mamba_n_heads / mamba_n_groups, NemotronH
    mamba_num_heads / n_groups, pure Mamba 2 num_heads / n_groups."""
    fields = ("mamba_n_heads", "mamba_num_heads")
    if config.get("model_type") == "mamba2":
        fields = ("num_heads",)
    heads_field = next((f for f in fields if f in config), None)
    heads = _positive(config.get(heads_field)) if heads_field else None
    if heads is None:
        return
    if heads % num_shard:
        raise ShardCountError(
            f"--num-shard {num_shard} does not divide the model's {heads} Mamba heads "
            f"({heads_field} in {path}): pass one of {_divisors(heads)}"
        )
    groups_field = "mamba_n_groups" if heads_field == "mamba_n_heads" else "n_groups"
    groups = _positive(config.get(groups_field)) or 1
    if groups % num_shard and num_shard % groups:
        raise ShardCountError(
            f"--num-shard {num_shard} cannot share the model's {groups} Mamba groups "
            f"({groups_field}): it must divide {groups} or be a multiple of it"
        )


def _check_mamba1_channels(num_shard: int, config: dict, path: Path) -> None:
    """A Mamba 1 mixer's inner channels (expand x hidden_size) split across the shards: Mamba's
    and FalconMamba's expand, Jamba's mamba_expand."""
    expand_field = {"mamba": "expand", "falcon_mamba": "expand", "jamba": "mamba_expand"}.get(
        config.get("model_type", "")
    )
    hidden, expand = _positive(config.get("hidden_size")), config.get(expand_field, 2)
    if expand_field is None or hidden is None or not isinstance(expand, int | float):
        return
    channels = int(expand * hidden)
    if channels % num_shard:
        raise ShardCountError(
            f"--num-shard {num_shard} does not divide the model's {channels} Mamba channels "
            f"({expand_field} x hidden_size in {path}): pass one of {_divisors(channels)}"
        )


def _check_kda_heads(num_shard: int, config: dict, path: Path) -> None:
    """Kimi Delta Attention's heads (Kimi Linear): linear_num_heads as transformers saves it,
    linear_attn_config.num_heads as Moonshot's release states it. (Ling's are its
    num_attention_heads, checked above.)"""
    nested = config.get("linear_attn_config")
    field, heads = "linear_num_heads", _positive(config.get("linear_num_heads"))
    if heads is None and isinstance(nested, dict):
        field, heads = "linear_attn_config.num_heads", _positive(nested.get("num_heads"))
    if heads is not None and heads % num_shard:
        raise ShardCountError(
            f"--num-shard {num_shard} does not divide the model's {heads} Kimi Delta Attention "
            f"heads ({field} in {path}): pass one of {_divisors(heads)}"
        )


def check_experts(
    expert_parallel: bool, num_shard: int, model_dir: Path, compiled: bool = False
) -> None:
    """How a Mixture-of-Experts model's experts split across the shards: whole experts with
    --expert-parallel (E/N each), else a 1/N slice of every expert's intermediate dimension.
    Raises ShardCountError naming the flag, the config field at fault and the values that work
    (and for --compile, which serves no MoE model)."""
    config = _text_config(model_dir)
    if config is None:
        return  # no readable config.json: the shard reports what it cannot load
    path = model_dir / "config.json"
    experts = _experts(config)
    if experts is not None and compiled:
        raise ShardCountError(
            f"--compile does not serve Mixture-of-Experts models ({path} has {experts[1]} "
            f"experts, {experts[0]}): their grouped experts' shapes follow each step's routing; "
            "serve it without --compile"
        )
    if experts is None:
        if expert_parallel:
            raise ShardCountError(
                f"--expert-parallel needs a Mixture-of-Experts model; {path} has no experts "
                "(num_local_experts/num_experts)"
            )
        return
    field, count = experts
    inter = _expert_intermediate(config)
    heads, kv_heads = _heads_of(config)

    def works(n: int, ep: bool) -> bool:
        if heads is not None and heads % n:
            return False
        if any(h % n for h in _layer_heads(config)):
            return False
        if kv_heads is not None and kv_heads % n and n % kv_heads:
            return False
        return all(size % n == 0 for _, size in _split_sizes(config, count, ep))

    def pass_one_of(size: int, ep: bool) -> str:
        ok = [str(n) for n in range(1, size + 1) if size % n == 0 and works(n, ep)]
        return f"pass one of {', '.join(ok)}" if ok else "no --num-shard value works"

    for what, size in _split_sizes(config, count, expert_parallel):
        if size % num_shard == 0:
            continue
        if what == "experts":
            instead = ""
            if inter is not None and works(num_shard, False):
                instead = (
                    f"; or drop --expert-parallel to split each expert's {inter[0]} ({inter[1]}) "
                    f"across the {num_shard} shards instead"
                )
            raise ShardCountError(
                f"--expert-parallel with --num-shard {num_shard} cannot give each shard a whole "
                f"number of the model's {count} experts ({field} in {path}): "
                f"{pass_one_of(count, True)}{instead}"
            )
        if what == "expert":
            assert inter is not None
            instead = ""
            if works(num_shard, True):
                instead = (
                    f"; or pass --expert-parallel to give each shard {count // num_shard} whole "
                    f"experts of the {count} instead"
                )
            raise ShardCountError(
                f"--num-shard {num_shard} does not divide the experts' intermediate size "
                f"({inter[0]} {size} in {path}); without --expert-parallel each shard holds a "
                f"slice of every expert: {pass_one_of(size, False)}{instead}"
            )
        if what == "shared":
            shared = _shared(config)
            assert shared is not None
            raise ShardCountError(
                f"--num-shard {num_shard} does not divide the shared expert's intermediate size "
                f"({shared[0]} in {path}); the shared expert is split "
                f"across the shards even with --expert-parallel: "
                f"{pass_one_of(size, expert_parallel)}"
            )
        raise ShardCountError(
            f"--num-shard {num_shard} does not divide the dense layers' intermediate size "
            f"(intermediate_size {size} in {path}, which has dense layers: "
            f"{_dense_reason(config)}); their MLPs are split across the shards even with "
            f"--expert-parallel: {pass_one_of(size, expert_parallel)}"
        )


def _text_config(model_dir: Path) -> dict[str, Any] | None:
    """config.json, or the LM's part of it; None when it cannot be read."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    # Qwen3-Omni keeps its thinker's inside thinker_config
    thinker = config.get("thinker_config")
    config = thinker if isinstance(thinker, dict) else config
    config = config.get("text_config", config)  # multimodal wrappers keep the LM's config inside
    return config if isinstance(config, dict) else None


def _head_counts(model_dir: Path) -> tuple[int | None, int | None]:
    """(attention heads, KV heads) from config.json; None where the config does not say (the
    shard then reports what it cannot load)."""
    config = _text_config(model_dir)
    return (None, None) if config is None else _heads_of(config)


def _heads_of(config: dict[str, Any]) -> tuple[int | None, int | None]:
    heads = config.get("num_attention_heads", config.get("n_head"))  # n_head: GPT-2's (StarCoder)
    kv_heads = config.get("num_key_value_heads")
    if kv_heads is None:
        if config.get("new_decoder_architecture"):  # Falcon-40B/180B, Falcon2
            kv_heads = config.get("num_kv_heads", heads)
        elif config.get("multi_query"):  # one KV head for every query head: StarCoder, Falcon-7B
            kv_heads = 1
        else:
            kv_heads = heads
    return _positive(heads), _positive(kv_heads)


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _experts(config: dict[str, Any]) -> tuple[str, int] | None:
    """(the config's field, the number of routed experts): Mixtral says num_local_experts,
    Qwen2-MoE and Qwen3-MoE num_experts, GLM-4.5 and DeepSeek n_routed_experts, ERNIE 4.5
    moe_num_experts; None for a model without experts."""
    for field in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        count = _positive(config.get(field))
        if count is not None:
            return field, count
    return None


def _expert_intermediate(config: dict[str, Any]) -> tuple[str, int] | None:
    """One expert's intermediate size: moe_intermediate_size (Qwen2-MoE, Qwen3-MoE), else
    intermediate_size (Mixtral, whose every MLP is a set of experts)."""
    for field in ("moe_intermediate_size", "intermediate_size"):
        size = _positive(config.get(field))
        if size is not None:
            return field, size
    return None


def _dense_reason(config: dict[str, Any]) -> str | None:
    """Why a Qwen2-MoE/Qwen3-MoE model has dense (non-expert) MLP layers; None when it has none."""
    only = config.get("mlp_only_layers")
    if isinstance(only, list) and only:
        return f"mlp_only_layers {only}"
    step = _positive(config.get("decoder_sparse_step"))
    if step is not None and step > 1:
        return f"decoder_sparse_step {step}"
    first = _positive(config.get("first_k_dense_replace"))  # GLM-4.5, DeepSeek
    if first is not None:
        return f"first_k_dense_replace {first}"
    for field in ("moe_layer_start_index", "moe_layer_interval"):  # ERNIE 4.5
        value = _positive(config.get(field))
        if value is not None and value > (0 if field.endswith("index") else 1):
            return f"{field} {value}"
    kinds = config.get("mlp_layer_types")  # GLM-4.7-Flash's, Laguna's, Mellum's list
    if isinstance(kinds, list) and "dense" in kinds:
        return "mlp_layer_types 'dense'"
    kinds = config.get("layers_block_type")  # NemotronH's dense MLP layers among its MoE ones
    if isinstance(kinds, list) and "mlp" in kinds:
        return "layers_block_type 'mlp'"
    return None


def _shared(config: dict[str, Any]) -> tuple[str, int] | None:
    """The shared expert's intermediate size and where the config says it: Qwen2-MoE's
    shared_expert_intermediate_size, or GLM-4.5's and DeepSeek's n_shared_experts (ERNIE 4.5's
    moe_num_shared_experts) experts of moe_intermediate_size (one MLP of their total width), or
    Nemotron 3's moe_shared_expert_intermediate_size."""
    for field in ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"):
        size = _positive(config.get(field))
        if size is not None:
            return f"{field} {size}", size
    each = _positive(config.get("moe_intermediate_size"))
    for field in ("n_shared_experts", "moe_num_shared_experts"):
        count = _positive(config.get(field))
        if count is not None and each is not None:
            return f"{field} {count} x moe_intermediate_size {each}", count * each
    return None


def _split_sizes(
    config: dict[str, Any], experts: int, expert_parallel: bool
) -> list[tuple[str, int]]:
    """What N shards must divide, as (kind, size): the shared expert and the dense layers'
    intermediate sizes (always tensor parallel), then the experts themselves (--expert-parallel)
    or each expert's intermediate size."""
    sizes: list[tuple[str, int]] = []
    shared = _shared(config)
    if shared is not None:
        sizes.append(("shared", shared[1]))
    dense = _positive(config.get("intermediate_size"))
    if "moe_intermediate_size" in config and dense is not None and _dense_reason(config):
        sizes.append(("dense", dense))
    if expert_parallel:
        sizes.append(("experts", experts))
    else:
        inter = _expert_intermediate(config)
        if inter is not None:
            sizes.append(("expert", inter[1]))
    return sizes


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
