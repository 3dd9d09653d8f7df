"""The kernels compile for a Hopper GPU (sm_90) with the configs a GPU run would use, even on a
CPU-only machine: catches what the interpreter cannot (see gpu_compile.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[dev]' on Linux)")


def test_kernels_compile_for_sm90():
    script = Path(__file__).with_name("gpu_compile.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # 18 attention and W4A16 variants (4 of them CUDA graphs' per-sequence decode splits; 2 at
    # Gemma 4's 512-dim heads, 2 chunked as Llama 4's, 2 with ALiBi), the 3 fused elementwise
    # kernels, the sampler's kept floor, 4 LoRA ones (gpu_compile_lora.py), the fused MoE's two
    # GEMMs with dense, FP8 and int4 experts (act-order too) and ungated dense ones.
    assert done.stdout.count("compiled for sm_90") == 39, done.stdout
