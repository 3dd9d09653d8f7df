"""The one typed place where the launcher reads environment variables."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class LauncherEnv:
    # Root of Switchyard's own cache (the default model and GGUF models'
    # configs live in versioned folders under it).
    cache_root: Path
    # huggingface_hub reads HF_HUB_OFFLINE once at import; reading it here keeps the launcher's
    # decision explicit and testable.
    hf_offline: bool
    # None when unset; "" or "-1" explicitly hide every GPU.
    cuda_visible_devices: str | None
    # Replace the program that starts a shard / the router (the launcher still appends the
    # documented arguments). Lets ops wrap shards in a profiler and tests use stand-ins.
    shard_program: tuple[str, ...] | None
    router_program: tuple[str, ...] | None
    # TGI's LORA_ADAPTERS: the adapters to serve when --lora-adapters is not given.
    lora_adapters: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> LauncherEnv:
        env = os.environ if environ is None else environ
        cache = env.get("SWITCHYARD_CACHE")
        return cls(
            cache_root=Path(cache).expanduser() if cache else Path.home() / ".cache" / "switchyard",
            hf_offline=env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE,
            cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
            shard_program=_program(env.get("SWITCHYARD_SHARD_COMMAND")),
            router_program=_program(env.get("SWITCHYARD_ROUTER_COMMAND")),
            lora_adapters=env.get("LORA_ADAPTERS") or None,
        )


def _program(value: str | None) -> tuple[str, ...] | None:
    return tuple(shlex.split(value)) if value and value.strip() else None
