"""bench/kernels.py --smoke: the GPU kernel benchmark's script runs end to end (tiny shapes, CPU
interpreter), so it does not rot between GPU sessions. Its timings mean nothing here; what is
checked is that every row is there and that each kernel agrees with SDPA on its shapes."""

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


def test_smoke_run_prints_every_kernel_and_agrees_with_sdpa():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for row in ROWS:
        (line,) = [x for x in lines if row in x]
        diff = re.search(r"(\d\.\d+e[-+]\d+)\s*$", line)
        if row != "kv write":  # compared with SDPA: bf16 agreement, a few output ulps
            assert diff and float(diff.group(1)) < 3e-2, line
