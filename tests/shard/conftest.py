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


@pytest.fixture(scope="module")
def large_lora_tiles():
    """Whole-model tests of the Triton LoRA kernels under TRITON_INTERPRET=1: one tile where the
    tiny models allow. The interpreter's defaults (lora_expand.default_expand_config,
    lora_shrink.default_shrink_config) cut test shapes into several N and K tiles (and split-K)
    on purpose, for the kernel tests in tests/kernels, which cover that tiling; here they only
    multiply the interpreted programs (most of these tests' time), not what is compared (eager
    or peft). Patched where lora_expand / lora_shrink look them up at call time. Compiled
    kernels on a GPU keep their real configs."""
    from shard.platforms.cuda.kernels import interpreting

    if not interpreting():
        yield
        return
    import dataclasses

    from shard.platforms.cuda.kernels import lora_expand, lora_shrink

    expand_config = lora_expand.default_expand_config
    shrink_config = lora_shrink.default_shrink_config

    def expand(rank, block_m, dtype):  # the tiny models' slices are <= 128 wide; whole rank
        cfg = expand_config(rank, block_m, dtype)
        return dataclasses.replace(cfg, block_n=128, block_r=max(16, 1 << (rank - 1).bit_length()))

    def shrink(nr, block_m, dtype):  # K (hidden, intermediate) <= 128: one K tile, no split
        return dataclasses.replace(shrink_config(nr, block_m, dtype), block_k=128)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lora_expand, "default_expand_config", expand)
        mp.setattr(lora_shrink, "default_shrink_config", shrink)
        yield
