"""`--model-id path/to/model.gguf` (or a directory holding one .gguf): checked before any
shard starts, then served from a directory in the cache holding the file's config and tokenizer
beside a link to the file, whose weights each shard dequantizes at load (shard/gguf/)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from launcher.cache_build import build_once
from shard.gguf.checks import GgufError, find_gguf, inspect_gguf

log = logging.getLogger("launcher")

# Bump when the directory's layout changes, so an old one is never served as the new.
LAYOUT = "v2"  # v2: the config fields of shard/gguf/config.py, Mixtral files as Mixtral


def gguf_model_dir(path: Path, cache_root: Path) -> Path | None:
    """The directory to serve for a GGUF `path`; None when `path` is not a GGUF model.
    Raises GgufError naming what cannot be served (architecture, quantization type)."""
    gguf_file = find_gguf(path)
    if gguf_file is None:
        return None
    info = inspect_gguf(gguf_file.resolve())
    target = cache_root / "gguf" / f"{gguf_file.stem}-{_fingerprint(info.path)}"
    if not target.is_dir():
        log.info(
            "GGUF %s (%s, %s): writing its config and tokenizer to %s; shards dequantize the "
            "weights at load",
            info.path,
            info.architecture,
            ", ".join(sorted(info.tensor_types)),
            target,
        )
        from shard.gguf.convert import write_model_dir

        build_once(target, lambda tmp: write_model_dir(info, tmp))
    return target


def _fingerprint(path: Path) -> str:
    """Names the file's version: another file, or this one rewritten, gets its own directory."""
    stat = path.stat()
    key = f"{LAYOUT}:{path}:{stat.st_size}:{stat.st_mtime_ns}"
    return hashlib.sha256(key.encode()).hexdigest()[:12]


__all__ = ["GgufError", "gguf_model_dir"]
