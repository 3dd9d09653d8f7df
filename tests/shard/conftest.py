"""Tiny random checkpoints shared by the shard tests, each built once per session on demand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import shard.platforms.cpu.native.build
from launcher.tiny_models import build_model
from shard.platforms.cpu.native.build import unavailable_reason
from tests.shard.tiny_model_cases import (
    MOE_MODELS,
    NEW_ARCH_MODELS,
    TINY_MODELS,
    VISION_LANGUAGE_MODELS,
)

ALL_MODELS = {**TINY_MODELS, **NEW_ARCH_MODELS, **MOE_MODELS, **VISION_LANGUAGE_MODELS}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Callable[[str], Path]:
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            architecture, overrides = ALL_MODELS[name]
            built[name] = build_model(tmp_path_factory.mktemp(name), architecture, **overrides)
        return built[name]

    return get


@pytest.fixture(scope="session")
def servicer_model_dir(tmp_path_factory) -> Path:
    """The Llama (GQA) the servicer tests drive through Prefill/Decode."""
    return build_model(tmp_path_factory.mktemp("servicer") / "llama", num_key_value_heads=2)


@pytest.fixture(scope="session")
def servicer_reference(servicer_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(servicer_model_dir, dtype=torch.float32).eval()


@pytest.fixture(
    params=[
        "torch",
        pytest.param(
            "native",
            marks=pytest.mark.skipif(
                unavailable_reason() is not None,
                # A toolchain reason, the same on a GPU machine: the CPU kernels need a C++
                # compiler and ninja (or were switched off), whatever the accelerator.
                reason=f"the native CPU kernels need a C++ compiler and ninja: "
                f"{unavailable_reason()}",
            ),
        ),
    ]
)
def rotary_path(request, monkeypatch):
    """Which path RotaryEmbedding takes on the CPU: its torch form, or the native kernel."""
    if request.param == "torch":
        monkeypatch.setattr(shard.platforms.cpu.native.build, "rotary_kernel", lambda: None)
    return request.param
