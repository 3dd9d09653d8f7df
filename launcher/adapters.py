"""`--lora-adapters`: which PEFT adapters to serve, under which names, from which directories.

Parsing happens with the other flags (a malformed list exits 2 naming the flag); resolution,
before anything is spawned: a local directory must hold `adapter_config.json`, anything else is
a hub id downloaded like a model (launcher/resolve.py). The shards get local directories only.
The list format and the name rules are shared with the router and the shards
(shard/lora/names.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher.env import LauncherEnv
from shard.lora.names import check_adapter_names, split_adapter_list

log = logging.getLogger("launcher")

FLAG = "--lora-adapters"
ADAPTER_CONFIG = "adapter_config.json"
# A PEFT adapter: its config and its weights (pickled .bin left out, as for models).
HUB_ALLOW_PATTERNS = [ADAPTER_CONFIG, "*.safetensors"]


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    source: str  # a local directory or a hub id, as given


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: Path  # local directory holding adapter_config.json


class AdapterError(RuntimeError):
    """An adapter that cannot be served; the message names it and the flag."""


def parse_specs(values: Iterable[str]) -> tuple[AdapterSpec, ...]:
    """`NAME=PATH[,NAME=PATH...]`, repeatable. A bare `PATH` is served under its own text as
    name (TGI's LORA_ADAPTERS=org/adapter). Raises ValueError naming the entry."""
    pairs = split_adapter_list(values, allow_bare=True, what="PATH")
    check_adapter_names([name for name, _ in pairs])
    return tuple(AdapterSpec(name, source) for name, source in pairs)


def check_served_name(specs: Sequence[AdapterSpec], served_name: str) -> None:
    """OpenAI's `model` selects an adapter by name: one named like the model is ambiguous."""
    for spec in specs:
        if spec.name == served_name:
            raise AdapterError(
                f"{FLAG}: adapter name {spec.name!r} is the served model name; rename the "
                "adapter or set --served-model-name"
            )


def resolve_adapters(specs: Sequence[AdapterSpec], env: LauncherEnv) -> tuple[LoraAdapter, ...]:
    return tuple(LoraAdapter(spec.name, _resolve(spec, env)) for spec in specs)


def _resolve(spec: AdapterSpec, env: LauncherEnv) -> Path:
    what = f"{FLAG}: adapter {spec.name!r}"
    local = Path(spec.source).expanduser()
    if local.is_dir():
        path = local.resolve()
    elif _looks_like_path(spec.source, local):
        # Not `org/name`: a hub lookup would only add a confusing error.
        raise AdapterError(f"{what}: {spec.source!r} is not a directory")
    else:
        path = _download(spec, env.hf_offline)
    if not (path / ADAPTER_CONFIG).is_file():
        raise AdapterError(f"{what}: {path} has no {ADAPTER_CONFIG} (not a PEFT adapter)")
    if "," in str(path):
        raise AdapterError(f"{what}: {path} contains ',', which {FLAG} lists cannot carry")
    return path


def _looks_like_path(source: str, local: Path) -> bool:
    return local.exists() or source.startswith(("/", "./", "../", "~")) or source.count("/") > 1


def _download(spec: AdapterSpec, offline: bool) -> Path:
    from huggingface_hub import snapshot_download

    what = f"{FLAG}: adapter {spec.name!r}"
    log.info("adapter %s: %s %s", spec.name, "cache lookup" if offline else "download", spec.source)
    try:
        path = snapshot_download(
            spec.source, allow_patterns=HUB_ALLOW_PATTERNS, local_files_only=offline
        )
    except Exception as exc:  # hub, HTTP and connection errors all end the same way
        if offline:
            raise AdapterError(
                f"{what}: {spec.source!r} is not a local directory and is not in the Hugging "
                "Face cache; HF_HUB_OFFLINE=1 forbids downloading it"
            ) from exc
        raise AdapterError(
            f"{what}: could not download {spec.source!r} from the Hugging Face hub "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    return Path(path)


def flag_value(adapters: Sequence[LoraAdapter]) -> str:
    """The children's `--lora-adapters` value: one comma-separated NAME=DIR list."""
    return ",".join(f"{a.name}={a.path}" for a in adapters)
