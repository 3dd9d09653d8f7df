"""A tiny checkpoint copied with config.json values changed, and the load that must refuse it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from shard.distributed import Distributed
from shard.models import load_model
from shard.models.config import UnsupportedArchitectureError


def with_config(source: Path, dst: Path, change: dict[str, Any]) -> Path:
    """`source` copied to `dst`, its config.json updated with `change`."""
    shutil.copytree(source, dst, dirs_exist_ok=True)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **change}))
    return dst


def assert_refused(source: Path, dst: Path, change: dict[str, Any], field: str) -> None:
    """Loading `source` with `change` raises UnsupportedArchitectureError naming `field`."""
    path = with_config(source, dst, change)
    with pytest.raises(UnsupportedArchitectureError, match=field):
        load_model(path, dtype=torch.float32, device=torch.device("cpu"), dist=Distributed())
