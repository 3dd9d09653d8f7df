"""Turns `--model-id` into a local directory the shards and the router can read."""

from __future__ import annotations

import logging
from pathlib import Path

from launcher.default_model import DefaultModelError, ensure_default_model
from launcher.env import LauncherEnv
from launcher.gguf_model import GgufError, gguf_model_dir

log = logging.getLogger("launcher")

# Everything a shard or the router reads: weights, configs, tokenizer, chat template.
# Pickled `.bin` weights are left out on purpose; safetensors is the supported download.
HUB_ALLOW_PATTERNS = [
    "*.safetensors",
    "*.json",
    "tokenizer.model",
    "*.tiktoken",
    "vocab.txt",
    "merges.txt",
    "*.jinja",
]


class ModelResolutionError(RuntimeError):
    """The model id is neither a servable local model nor downloadable right now."""


def resolve_model(model_id: str | None, env: LauncherEnv) -> Path:
    if model_id is None:
        try:
            return ensure_default_model(env.cache_root)
        except DefaultModelError as exc:
            raise ModelResolutionError(str(exc)) from exc
    local = Path(model_id).expanduser()
    try:
        gguf_dir = gguf_model_dir(local, env.cache_root)
    except GgufError as exc:
        raise ModelResolutionError(f"--model-id {model_id}: {exc}") from exc
    if gguf_dir is not None:
        return gguf_dir
    if local.is_dir():
        return local.resolve()
    if local.exists() or model_id.startswith(("/", "./", "../", "~")) or model_id.count("/") > 1:
        # Looks like a path, not `org/name`: a hub lookup would only add a confusing error.
        raise ModelResolutionError(f"--model-id {model_id!r}: no such model directory")
    return _download(model_id, offline=env.hf_offline)


def _download(repo_id: str, *, offline: bool) -> Path:
    from huggingface_hub import snapshot_download

    if offline:
        log.info("HF_HUB_OFFLINE is set: looking for %s in the local Hugging Face cache", repo_id)
    else:
        log.info("downloading %s from the Hugging Face hub", repo_id)
    try:
        path = snapshot_download(
            repo_id, allow_patterns=HUB_ALLOW_PATTERNS, local_files_only=offline
        )
    except Exception as exc:  # hub, HTTP and connection errors all end the same way
        raise ModelResolutionError(_explain(repo_id, offline, exc)) from exc
    return Path(path)


def _explain(repo_id: str, offline: bool, exc: Exception) -> str:
    if offline:
        return (
            f"model {repo_id!r} is not a local directory and is not in the Hugging Face cache; "
            "HF_HUB_OFFLINE=1 forbids downloading it. Pass a local directory as --model-id "
            "or download it first."
        )
    return (
        f"could not download model {repo_id!r} from the Hugging Face hub "
        f"({type(exc).__name__}: {exc}). If this machine is offline, pass a local directory "
        "as --model-id; for a gated model, set HF_TOKEN."
    )
