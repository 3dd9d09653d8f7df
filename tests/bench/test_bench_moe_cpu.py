"""bench/moe_cpu.py runs end to end at its smallest (one layer, one repeat): a row per token
count with the three forms' timings and their ratios to the one call (the script itself checks
the forms' outputs against each other), and a row per shape in the rows kernel's table. Its
timings mean nothing at this size; what is checked is that the script does not rot."""

from __future__ import annotations

import re
import subprocess
import sys

from shard.platforms.cpu.native.build import rows_linear_kernel


def test_prints_every_form_with_its_ratio_and_the_rows_table():
    done = subprocess.run(
        [sys.executable, "-m", "bench.moe_cpu", "--tokens", "1", "3", "--rows", "2",
         "--layers", "1", "--repeats", "1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for tokens in (1, 3):
        row = re.search(rf"^\s+{tokens}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+torch form ([\d.]+)x, "
                        r"torch linear ([\d.]+)x$", done.stdout, re.M)  # fmt: skip
        assert row, done.stdout
        assert all(float(v) > 0 for v in row.groups())
    if rows_linear_kernel() is not None:
        for shape in ("expert gate_up", "expert down", "lm_head"):
            assert re.search(rf"^\s+{shape}\s+2\s+[\d.]+\s+[\d.]+\s+[\d.]+$", done.stdout, re.M)
