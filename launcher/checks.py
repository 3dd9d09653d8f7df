"""Checks of `--num-shard` against the machine and the model, before any shard is spawned.

Each mistake caught here would otherwise surface minutes later, deep inside N shard logs (a CUDA
"invalid device ordinal", a loader error on one rank, a rendezvous that never completes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from launcher.devices import visible_gpu_count


class ShardCountError(ValueError):
    """`--num-shard` cannot work on this machine or for this model."""


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
    if kv_heads is not None and kv_heads % num_shard and num_shard % kv_heads:
        # KV heads split across shards, or, when there are fewer of them, are replicated.
        raise ShardCountError(
            f"--num-shard {num_shard} cannot share the model's {kv_heads} key/value heads "
            f"(num_key_value_heads): it must divide {kv_heads} or be a multiple of it"
        )


def _head_counts(model_dir: Path) -> tuple[int | None, int | None]:
    """(attention heads, KV heads) from config.json; None where the config does not say (the
    shard then reports what it cannot load)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(config, dict):
        return None, None
    config = config.get("text_config", config)  # multimodal wrappers keep the LM's config inside
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads", heads)
    as_int = [v if isinstance(v, int) and v > 0 else None for v in (heads, kv_heads)]
    return as_int[0], as_int[1]


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
