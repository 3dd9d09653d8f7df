"""bench/quant_decode.py end to end on the tiny AWQ fixture and its dequantized twin, so the
int4-vs-bf16 benchmark cannot rot. Timings mean nothing here and are not checked; what is checked
is that every case ran on both shards, that the AWQ shard served in bf16 (the int4 kernel's
dtype), and that both shards' memory was read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "quant_fixtures" / "awq_gemm_g64_llama"


def test_tiny_pair_reports_both_models_at_every_batch_size(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "bench.quant_decode",
        # reference/ is the same model dequantized by AutoAWQ: the float twin, served in bf16.
        *("--pair", "tiny", str(FIXTURE / "reference"), str(FIXTURE)),
        *("--batch-sizes", "1", "3", "--prompt-len", "8", "--steps", "2", "--rounds", "2"),
        *("--out", str(tmp_path)),
    ]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = tmp_path.glob("quant-decode-*.json")
    result = json.loads(path.read_text())
    (pair,) = result["pairs"]

    ran = {(c["model"], c["batch"], c["round"]) for c in pair["cases"]}
    assert ran == {(m, b, r) for m in ("bf16", "awq") for b in (1, 3) for r in (0, 1)}
    assert all(c["decode_tok_s"] > 0 for c in pair["cases"])
    assert {s["dtype"] for s in pair["shards"].values()} == {"bfloat16"}
    for shard in pair["shards"].values():
        mem = shard["memory"]
        # VmHWM never falls, and a loaded shard (torch + grpc + model) holds well over 50 MiB.
        assert 50 * 2**20 < mem["loaded"]["VmHWM"] <= mem["warm"]["VmHWM"] <= mem["end"]["VmHWM"]

    summary = result["summary"]
    assert [(r["pair"], r["batch"]) for r in summary["decode"]] == [("tiny", 1), ("tiny", 3)]
    assert all(len(r["ratio_per_round"]) == 2 and r["ratio"] > 0 for r in summary["decode"])
    assert {m["model"] for m in summary["memory"]} == {"bf16", "awq"}
    assert "AWQ / bf16" in done.stdout and (tmp_path / path.with_suffix(".md").name).is_file()
