"""bench/decode_graphs.py --smoke: the GPU decode-step benchmark's script runs end to end (a tiny
shape on the CPU, graphs replayed by the eager stand-in), so it does not rot between GPU
sessions. Its timings mean nothing here; what is checked is that every batch size has its row
for each kind of sampling, with both timings, and the weight bytes its roofline counts."""

from __future__ import annotations

import math
import re
import subprocess
import sys

from bench.decode_graphs import checkpoint_shapes, hf_config


def test_smoke_run_prints_a_row_per_batch_with_both_timings(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.decode_graphs", "--smoke", "--out", str(tmp_path),
         "--sampling", "greedy,top-p,penalty", "--shapes", "7b,7b-awq"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for shape in ("tiny", "tiny-awq"):  # --smoke's shape for each, the second one int4
        for batch in (1, 3):
            for sampling in ("greedy", "top-p", "penalty"):
                row = re.search(
                    rf"^\| {shape} \| {sampling} \| {batch} \| ([\d.]+) \| ([\d.]+) \|",
                    done.stdout, re.M,
                )  # fmt: skip
                assert row, done.stdout
                assert float(row.group(1)) > 0 and float(row.group(2)) > 0
            ratio = rf"^tiny-awq batch {batch} greedy: graphed step [\d.]+ ms against [\d.]+ ms"
            assert re.search(ratio, done.stdout, re.M), done.stdout
    assert list(tmp_path.glob("decode_graphs-*.json"))


def test_awq_shapes_hold_autoawq_tensors_for_every_layer_linear():
    config = hf_config("7b-awq")
    assert config["quantization_config"]["group_size"] == 128
    shapes = checkpoint_shapes(config)
    assert shapes["model.layers.0.mlp.down_proj.qweight"] == [11008, 4096 // 8]
    assert shapes["model.layers.0.mlp.down_proj.qzeros"] == [11008 // 128, 4096 // 8]
    assert shapes["model.layers.31.self_attn.q_proj.scales"] == [4096 // 128, 4096]
    assert not any(name.endswith("_proj.weight") for name in shapes)
    assert shapes["lm_head.weight"] == [32000, 4096]  # the head stays in bf16


def test_the_shapes_are_the_published_models_sizes():
    # Parameters of Llama-3.2-1B (1.24 B, tied) and Llama-2-7B (6.74 B), from the configs alone.
    for name, billions in (("1b", 1.236), ("7b", 6.738)):
        shapes = checkpoint_shapes(hf_config(name))
        total = sum(math.prod(s) for s in shapes.values()) / 1e9
        assert abs(total - billions) < 0.005, (name, total)
