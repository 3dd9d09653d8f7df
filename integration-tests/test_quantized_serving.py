"""Int4 and FP8 checkpoints, as AutoAWQ, GPTQModel, llm-compressor and transformers wrote them,
served through the launcher and HTTP: greedy ids and logprobs equal transformers on the same
models dequantized by those libraries (each fixture's reference/), on 1 and 2 shards (gloo on
CPU). The Triton
kernels (the W4A16 GEMM and its FP8 variant, with Triton attention) on these checkpoints are
tests/kernels/test_quantized_triton.py's, at the shard, where the interpreter's cost stays small.

AWQ (group 64) on 2 shards splits o_proj's 128 inputs into one group per shard; GPTQ act-order
on 2 shards gives each shard rows of scattered groups; compressed-tensors' per-channel
asymmetric scales split by rows too; transformers' FP8 Phi-3 splits inside its scale blocks;
gptqmodel's int4 experts split by their intermediate groups.
A broken checkpoint stops the launcher, naming the tensor.
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
from safetensors.torch import load_file, save_file
from server_process import LauncherProcess, free_port, launcher_command

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "quant_fixtures"
PROMPTS = [("Hello", 10), ("The quick brown fox jumps over the lazy dog.", 14), ("日本語 🚀", 8)]
LOGPROB_TOLERANCE = 1e-3
# Two shards need two GPUs; short of that, both run on the CPU with gloo.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""} if torch.cuda.device_count() < 2 else {}
ONE_SHARD = "awq_gemm_g64_llama"  # also served on one shard
SMALL = ("--max-input-tokens", "64", "--max-total-tokens", "96",
         "--max-batch-prefill-tokens", "64", "--max-batch-total-tokens", "1024")  # fmt: skip


def generate(url: str, prompt: str, max_new_tokens: int) -> dict:
    body = {
        "inputs": prompt,
        "parameters": {"max_new_tokens": max_new_tokens, "details": True,
                       "decoder_input_details": True},
    }  # fmt: skip
    response = requests.post(f"{url}/generate", json=body, timeout=600)
    assert response.status_code == 200, response.text
    return response.json()["details"]


def serve(name: str, *args: str, env: dict[str, str] | None = None) -> list[dict]:
    """`args` after SMALL: a limit given again overrides SMALL's."""
    with LauncherProcess(FIXTURES / name, "--dtype", "float32", *SMALL, *args, env=env) as server:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            return list(pool.map(lambda job: generate(server.url, *job), PROMPTS))


def assert_matches_reference(name: str, served: list[dict], what: str) -> None:
    for (prompt, max_new), got in zip(PROMPTS, served, strict=True):
        ref = greedy(FIXTURES / name / "reference", prompt, max_new, tokenizer_dir=FIXTURES / name)
        assert [t["id"] for t in got["tokens"]] == ref.token_ids, f"{what}: {prompt!r}"
        for step, (token, want) in enumerate(zip(got["tokens"], ref.logprobs, strict=True)):
            assert token["logprob"] == pytest.approx(want, abs=LOGPROB_TOLERANCE), (what, step)
        prefill = got["prefill"][1:]
        for token, want in zip(prefill, ref.prompt_logprobs, strict=True):
            assert token["logprob"] == pytest.approx(want, abs=LOGPROB_TOLERANCE), what


@pytest.mark.parametrize(
    "name",
    [
        "awq_gemm_g64_llama",
        "gptq_g32_actorder_sym_llama",
        "ct_w4a16_channel_asym_qwen2_tied",
        # transformers' FP8 in 128-wide blocks: Phi-3's fused qkv_proj cut between k and v
        # inside a block, o_proj's 128 inputs cut inside one too
        "hf_fp8_block_phi3",
        # gptqmodel's int4 Qwen3-MoE: every expert kept int4, each cut on its groups per shard
        "gptq_g32_sym_qwen3_moe",
    ],
)
def test_one_and_two_shards_equal_transformers_on_the_library_dequantized_model(name):
    """Two shards for every format; one shard, with --quantize naming the format as the product
    command line does, for AWQ's (each fixture's one-rank model is compared with its reference
    at the shard, tests/shard/test_quantized_models.py and test_fp8_models.py)."""
    with ThreadPoolExecutor(2) as pool:
        two = pool.submit(serve, name, "--num-shard", "2", env=CPU_ONLY)
        one = None
        if name == ONE_SHARD:
            method = json.loads((FIXTURES / name / "config.json").read_text())[
                "quantization_config"
            ]["quant_method"]
            one = pool.submit(serve, name, "--num-shard", "1", "--quantize", method)
        two_shards = two.result()
        if one is not None:
            assert_matches_reference(name, one.result(), "1 shard")
    assert_matches_reference(name, two_shards, "2 shards")


def test_a_checkpoint_missing_a_tensor_stops_the_launcher_naming_it(tmp_path):
    import subprocess

    broken = tmp_path / "broken"
    shutil.copytree(
        FIXTURES / "awq_gemm_g64_llama", broken, ignore=shutil.ignore_patterns("reference")
    )
    state = load_file(broken / "model.safetensors")
    del state["model.layers.1.mlp.down_proj.qzeros"]
    save_file(state, broken / "model.safetensors", metadata={"format": "pt"})
    done = subprocess.run(
        [*launcher_command(), "--model-id", str(broken), "--port", str(free_port()),
         "--shard-uds-path", str(tmp_path / "shard")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    assert "missing tensor 'model.layers.1.mlp.down_proj.qzeros'" in done.stdout + done.stderr
