"""bench/roofline.py on a tiny model: the figures it writes are consistent with each other and
with the model (its weight bytes, one rate per distinct linear shape, the LM head counted)."""

import json

import pytest
import torch

from bench import roofline
from launcher.tiny_models import build_model


def test_roofline_figures_hold_together(tmp_path):
    model_dir = build_model(tmp_path / "tiny")
    out = tmp_path / "out"
    roofline.main(
        ["--model-dir", str(model_dir), "--dtype", "float32", "--batch", "4", "--seq-len", "8",
         "--steps", "3", "--repeats", "1", "--bandwidth-gib", "0.05", "--out", str(out)]
    )  # fmt: skip
    (path,) = out.glob("roofline-*.json")
    r = json.loads(path.read_text())
    assert r["roofline_ms"] == max(r["memory_floor_ms"], r["compute_floor_ms"]) > 0
    assert r["measured_step_ms"] > 0
    # The ratio is computed in seconds, the figures are written in ms: equal up to rounding.
    assert r["measured_over_roofline"] == pytest.approx(r["measured_step_ms"] / r["roofline_ms"])
    assert r["read_bandwidth_gb_s"] > 0.1 and r["threads"] == torch.get_num_threads()
    config = json.loads((model_dir / "config.json").read_text())
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    assert f"{hidden}x{vocab}" in r["gemm_gflop_s_at_step_shapes"]  # the LM head
    assert all(rate > 0 for rate in r["gemm_gflop_s_at_step_shapes"].values())
    # Memory floor: every weight a step reads once (float32 here: not the embedding table, of
    # which a step reads a row per token; a tied head's own copy counts), and the batch's K/V.
    weights = _weights(model_dir)
    read = sum(t.numel() for name, t in weights.items() if "embed_tokens" not in name)
    assert 4 * read * 0.99 <= r["weight_bytes"] <= 4 * (read + hidden * vocab) * 1.01
    assert r["context"] == 8 + 3 and r["batch"] == 4


def _weights(model_dir):
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")
