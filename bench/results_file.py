"""Where a benchmark writes what it measured: `<out>/<stem>-<time>.json`, one file per run."""

from __future__ import annotations

import json
import time
from importlib import metadata
from pathlib import Path
from typing import Any


def write_results(out: Path, stem: str, results: Any) -> Path:
    """Writes `results` as indented JSON (anything JSON cannot encode as its str) and returns
    the path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2, default=str))
    return path


def package_version(name: str) -> str | None:
    """The installed version of `name`; None where it is not installed (Switchyard on a GPU
    machine runs from the checkout, uninstalled)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
