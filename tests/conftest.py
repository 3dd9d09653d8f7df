"""Kernel tests run compiled on a GPU when there is one, else in triton's CPU interpreter.

Triton picks compiler or interpreter when a function is defined, its own standard library
(`tl.zeros`...) included, i.e. when triton is first imported. So TRITON_INTERPRET is set here,
in the conftest pytest loads before collecting any test under tests/: a test module collected
before tests/kernels/ that imports triton would otherwise fix it to the compiler.
"""

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def whole_model_tiles():
    """Whole-model tests of the Triton kernels under TRITON_INTERPRET=1: tiles as large as the
    tiny models' layers and prompts allow. The interpreter's defaults cut test shapes into many
    small tiles (and split-K) on purpose, for the kernel tests in tests/kernels, which cover
    that tiling (the online softmax over several key tiles, groups within K tiles...); in a
    whole model they only multiply the interpreted programs (most of these tests' time), not
    what is compared. Patched where each kernel module looks its default up at call time.
    Compiled kernels on a GPU keep their real configs."""
    from shard.platforms.cuda.kernels import interpreting

    if not interpreting():
        yield
        return
    from shard.platforms.cuda.kernels import decode, lora_expand, lora_shrink, prefill, w4a16
    from shard.platforms.cuda.kernels.w4a16_config import SKINNY_M, W4A16Config, block_k

    expand_config = lora_expand.default_expand_config
    shrink_config = lora_shrink.default_shrink_config

    def expand(rank, block_m, dtype):  # the tiny models' slices are <= 128 wide; whole rank
        cfg = expand_config(rank, block_m, dtype)
        return dataclasses.replace(cfg, block_n=128, block_r=max(16, 1 << (rank - 1).bit_length()))

    def shrink(nr, block_m, dtype):  # K (hidden, intermediate) <= 128: one K tile, no split
        return dataclasses.replace(shrink_config(nr, block_m, dtype), block_k=128)

    def gemm(m, n, group_size, dtype, sms, act_order=False):  # int4 and FP8 weights
        # up to 64 rows x 128 outputs, K tiles of up to 128 inside a group or scale block; the
        # decode path's scales after the dot, as the real decode config has them
        return W4A16Config(64, 128, block_k(128, group_size), 4, 1, scale_after_dot=m <= SKINNY_M)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lora_expand, "default_expand_config", expand)
        mp.setattr(lora_shrink, "default_shrink_config", shrink)
        mp.setattr(w4a16, "default_config", gemm)
        mp.setattr(
            prefill,
            "default_prefill_config",
            lambda head_dim, dtype: prefill.PrefillConfig(64, 64, 1, 1),
        )
        mp.setattr(decode, "default_decode_config", lambda head_dim: decode.DecodeConfig(64, 1, 1))
        yield
