"""bench/moe_int4_cpu.py runs end to end at its smallest (one layer, one repeat): a row per token
count with both forms' timings and their ratio (the script itself checks the int4 experts'
output against the bf16 ones'). Its timings mean nothing at this size; what is checked is that
the script does not rot."""

from __future__ import annotations

import re
import subprocess
import sys


def test_prints_both_forms_with_their_ratio():
    done = subprocess.run(
        [sys.executable, "-m", "bench.moe_int4_cpu", "--tokens", "1", "3", "--layers", "1",
         "--repeats", "1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for tokens in (1, 3):
        row = re.search(rf"^\s+{tokens}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.e+-]+)$",
                        done.stdout, re.M)  # fmt: skip
        assert row, done.stdout
        assert all(float(v) > 0 for v in row.groups()[:3])
