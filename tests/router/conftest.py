"""Shared fixtures: the tiny byte-level BPE tokenizer, in memory and saved as a model dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.tiny_models import build_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer(512)


@pytest.fixture(scope="session")
def model_dir(tokenizer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-tokenizer")
    tokenizer.save_pretrained(path)
    return path
