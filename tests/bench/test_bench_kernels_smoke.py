"""bench/kernels.py --smoke: the GPU kernel benchmark's script runs end to end (tiny shapes, CPU
interpreter), so it does not rot between GPU sessions. Its timings mean nothing here; what is
checked is that every row is there and that each kernel agrees with its baseline on its shapes
(SDPA for attention, torch.matmul on the dense weight for the W4A16 GEMM)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Checked without importing triton: the benchmark runs in its own process, and this one has no
# use for triton itself.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install -e '.[dev]' on Linux)",
)

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "kernels.py"
ROWS = ("decode B=3 ctx=48", "decode B=1 ctx=96", "window=32", "prefill causal", "kv write")
# Decode (one token, a whole 16-token tile) and prefill paths; K and N off the tiles.
W4A16_ROWS = tuple(
    f"w4a16 M={m} K={k} N={n}" for k, n in ((136, 40), (256, 24)) for m in (1, 16, 37)
)
# One LoRA term (shrink + expand) per layer and step, against the torch per-slot loop in fp32.
LORA_ROWS = tuple(
    f"lora {layer} {step}"
    for layer in ("qkv", "down")
    for step in ("decode T=1", "decode T=7", "prefill T=40")
)


def test_smoke_run_prints_every_kernel_and_agrees_with_its_baseline():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for row in ROWS + W4A16_ROWS + LORA_ROWS:
        (line,) = [x for x in lines if row in x]
        diff = re.findall(r"\d\.\d+e[-+]\d+", line)  # max|diff|, the last column with one
        if row in W4A16_ROWS:
            # fp16, outputs of O(1): torch's dense fp16 weight is rounded, ours exact until the
            # output is rounded; a few fp16 ulps apart.
            assert diff and float(diff[-1]) < 1e-2, line
        elif row in LORA_ROWS:
            # bf16 y of |y| < 8, rounded once; the interpreter truncates: up to an ulp, 2^-5.
            assert diff and float(diff[-1]) < 7e-2, line
        elif row != "kv write":  # compared with SDPA: bf16 agreement, a few output ulps
            assert diff and float(diff[-1]) < 3e-2, line
