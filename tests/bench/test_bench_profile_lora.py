"""bench/profile_lora.py runs end to end on a tiny model, decode and --prefill, so the script
behind docs/benchmarks.md's in-process LoRA figures does not rot. Its timings mean nothing here;
what is checked is a row per slot count, the base row first at 1.00x."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from launcher.tiny_models import build_model


@pytest.mark.parametrize("mode", [[], ["--prefill"]], ids=["decode", "prefill"])
def test_prints_a_row_per_slot_count(tmp_path, mode):
    base = build_model(tmp_path / "base")
    done = subprocess.run(
        [sys.executable, "-m", "bench.profile_lora", "--model-dir", str(base), "--adapters", "3",
         "--rank", "4", "--max-lora-rank", "8", "--batch", "3", "--seq-len", "8", "--steps", "2",
         "--rounds", "1", "--slots", "0", "3", *mode],
        env={**os.environ, "SWITCHYARD_CACHE": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("prefill" if mode else "decode"), done.stdout
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", done.stdout, re.M)
    assert [r[0] for r in rows] == ["0", "3"], done.stdout
    assert rows[0][3] == "1.00" and float(rows[1][1]) > 0, done.stdout
