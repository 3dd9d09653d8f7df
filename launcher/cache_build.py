"""Builds a directory of Switchyard's cache once, atomically."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """`target`, built first by `build(tmp)` if the cache has none. The build goes to a temp
    folder beside it that is renamed into place: a crash (or Ctrl-C) mid-build leaves only a
    temp folder, never a half-written model that later runs would take for complete."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another launcher finished first; its build is of the same input, keep it.
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
