"""bench/host_step.py runs end to end on a small setting and prints, for every batch and kind
of sampling, both timings and their ratio (the timings themselves mean nothing here)."""

from __future__ import annotations

import re
import subprocess
import sys


def test_prints_both_plans_for_every_batch_and_sampling(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.host_step", "--batches", "1,3", "--steps", "12",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for batch in (1, 3):
        for sampling in ("greedy", "top-p"):
            row = re.search(
                rf"^\| {batch} \| {sampling} \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|$",
                done.stdout,
                re.M,
            )
            assert row, done.stdout
            fast, general, ratio = (float(g) for g in row.groups())
            assert fast > 0 and general > 0
            assert abs(ratio - general / fast) < 0.01 + 0.01 * ratio
    assert list(tmp_path.glob("host_step-*.json"))
