"""Speculative decoding with a draft model, through the launcher and HTTP: the case a user has at
hand, an int4 copy of the model as its own draft. The model is AutoAWQ's checkpoint dequantized
by AutoAWQ (the fixture's reference/, served dense), the draft that AWQ checkpoint itself (int4
kernels), both sharded over 2 ranks (gloo on CPU). Greedy ids and logprobs equal transformers
on the model, seeded sampling repeats itself, and the draft's guesses were proposed and, for the
greedy requests, mostly accepted (they are the model's own tokens but for int4 rounding; the
tiny model's sampled distributions are too flat for a greedy guess to be drawn often).
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch
from reference import greedy
from server_process import LauncherProcess, generate_details, metric_value

pytestmark = pytest.mark.slow
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "quant_fixtures" / "awq_gemm_g64_llama"
PROMPTS = [("Hello", 12), ("The quick brown fox jumps over the lazy dog.", 16), ("日本語 🚀", 10)]
LOGPROB_TOLERANCE = 1e-3
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""} if torch.cuda.device_count() < 2 else {}


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory) -> Path:
    """The dequantized model with the checkpoint's tokenizer beside it, as a user would have."""
    target = tmp_path_factory.mktemp("draft-serving") / "dense"
    shutil.copytree(FIXTURE / "reference", target)
    for name in ("tokenizer.json", "chat_template.jinja", "generation_config.json"):
        if (FIXTURE / name).exists():
            shutil.copy(FIXTURE / name, target / name)
    return target


def test_an_int4_copy_as_draft_over_two_shards_equals_transformers(dense_dir):
    config = json.dumps(
        {"model": str(FIXTURE), "num_speculative_tokens": 3, "disable_by_batch_size": None}
    )
    args = ("--num-shard", "2", "--dtype", "float32", "--max-total-tokens", "96",
            "--max-batch-total-tokens", "1024", "--speculative-config", config)  # fmt: skip
    seeded = {"do_sample": True, "temperature": 0.9, "seed": 5}
    with LauncherProcess(dense_dir, *args, env=CPU_ONLY) as server:
        with ThreadPoolExecutor(len(PROMPTS) + 1) as pool:
            jobs = [
                pool.submit(generate_details, server.url, p, n, 600, decoder_input_details=True)
                for p, n in PROMPTS
            ]
            sampled = pool.submit(generate_details, server.url, "Hello", 12, 600, **seeded)
            refs = [greedy(dense_dir, p, n) for p, n in PROMPTS]
            served = [j.result() for j in jobs]
            first_draw = [t["id"] for t in sampled.result()["tokens"]]
        repeated = generate_details(server.url, "Hello", 12, 600, **seeded)["tokens"]
        metrics = requests.get(f"{server.url}/metrics", timeout=30).text
        log = server.log_path.read_text(errors="replace")
    assert "speculative decoding with the draft model" in log
    assert log.count("loading the draft model") == 2  # one per rank
    for (prompt, _), ref, got in zip(PROMPTS, refs, served, strict=True):
        assert [t["id"] for t in got["tokens"]] == ref.token_ids, prompt
        for step, (token, want) in enumerate(zip(got["tokens"], ref.logprobs, strict=True)):
            assert token["logprob"] == pytest.approx(want, abs=LOGPROB_TOLERANCE), (prompt, step)
    assert first_draw == [t["id"] for t in repeated]
    proposed = metric_value(metrics, "switchyard_spec_decode_num_draft_tokens")
    accepted = metric_value(metrics, "switchyard_spec_decode_num_accepted_tokens")
    greedy_tokens = sum(n - 1 for _, n in PROMPTS)  # each but the first could be a guess
    assert proposed > 0 and accepted >= greedy_tokens / 2, (proposed, accepted)
