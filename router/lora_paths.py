"""Where a runtime-loaded adapter may come from: a directory inside --lora-dir.

The route is guarded by the API key, but a key holder must still not make the shards read any
file of the host: the path is resolved with every symlink followed (a link inside --lora-dir
pointing elsewhere is outside), and so are the adapter files the shards will open by name. A
relative path is taken relative to --lora-dir. The shards get the resolved directory.
"""

from __future__ import annotations

import os

from router.errors import AdapterRequestError

# What shard/lora/adapter.py opens inside an adapter's directory.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
# Linux's PATH_MAX (4096) less the terminating NUL: no longer path can be opened.
MAX_LORA_PATH_BYTES = 4095


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def resolve_lora_path(lora_path: object, lora_dir: str) -> str:
    """The real directory of `lora_path`, or a 400 naming the path and --lora-dir.

    `lora_dir` is already a real path (router/args.py resolves it)."""
    if not isinstance(lora_path, str) or not lora_path:
        raise AdapterRequestError("`lora_path` must be a non-empty string")
    size = len(lora_path.encode("utf-8", "surrogatepass"))
    if size > MAX_LORA_PATH_BYTES:  # before any message below echoes it
        raise AdapterRequestError(
            f"`lora_path` must be at most {MAX_LORA_PATH_BYTES} bytes (PATH_MAX). Given: {size}"
        )
    try:
        real = os.path.realpath(os.path.join(lora_dir, lora_path))
    except ValueError:  # an embedded NUL byte
        raise AdapterRequestError(f"`lora_path` {lora_path!r} is not a valid path") from None
    if not _inside(real, lora_dir):
        raise AdapterRequestError(
            f"`lora_path` {lora_path!r} is outside --lora-dir {lora_dir}: runtime-loaded "
            "adapters must be directories under it (symlinks are followed)"
        )
    if not os.path.isdir(real):
        raise AdapterRequestError(
            f"`lora_path` {lora_path!r} is not a directory under --lora-dir {lora_dir}"
        )
    for name in ADAPTER_FILES:
        file = os.path.join(real, name)
        if os.path.lexists(file) and not _inside(os.path.realpath(file), lora_dir):
            raise AdapterRequestError(
                f"`lora_path` {lora_path!r}: {name} is a link to outside --lora-dir {lora_dir}"
            )
    return real
