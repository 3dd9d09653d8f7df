"""The demo model served when no `--model-id` is given: built once, then reused from the cache."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("launcher")

# Bump the suffix whenever the shape changes, so an old cached build is never served as the new.
DEMO_NAME = "demo-llama-v1"
# Small enough to load and run in seconds on a CPU, big enough to exercise GQA (8 query heads
# over 4 KV heads), several layers, TP up to 4 ranks, and long contexts.
DEMO_SHAPE: dict[str, Any] = {
    "architecture": "LlamaForCausalLM",
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "seed": 0,
}


def demo_model_dir(cache_root: Path) -> Path:
    return cache_root / DEMO_NAME


def ensure_demo_model(cache_root: Path) -> Path:
    """Returns the demo model directory, building it first if this cache has none."""
    target = demo_model_dir(cache_root)
    if target.is_dir():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    log.info("building the demo model into %s (first use only)", target)
    # Built beside the target and renamed into place: a crash mid-build leaves only a temp
    # folder, never a half-written model that later runs would take for complete.
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEMO_NAME}.tmp-", dir=cache_root))
    try:
        from launcher.tiny_models import build_model

        build_model(tmp, **DEMO_SHAPE)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another launcher finished first; its copy is identical (same seed), keep it.
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
