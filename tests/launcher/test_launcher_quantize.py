"""`--quantize` and `--num-shard` against a quantized checkpoint, refused before any spawn."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import launcher.main as launcher_main
from launcher.args import parse_args
from launcher.commands import Programs, shard_spec
from launcher.env import LauncherEnv
from launcher.quant_checks import QuantizationCheckError, check_quantization

FIXTURES = Path(__file__).resolve().parents[1] / "quant_fixtures"
AWQ = FIXTURES / "awq_gemm_g64_llama"
G128 = FIXTURES / "gptq_g128_sym_llama"  # o_proj: 128 inputs, 64 per shard of 2 < group 128


def test_flag_is_optional_and_must_agree_with_the_checkpoint():
    check_quantization(None, 1, AWQ)
    check_quantization("awq", 1, AWQ)
    with pytest.raises(QuantizationCheckError, match=r"--quantize gptq disagrees .* awq"):
        check_quantization("gptq", 1, AWQ)


def test_flag_on_a_float_checkpoint_is_refused_but_fp8_quantizes_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(QuantizationCheckError, match="not a quantized checkpoint"):
        check_quantization("awq", 1, tmp_path)
    check_quantization(None, 1, tmp_path)
    check_quantization("fp8", 2, tmp_path)  # quantized at load, any shard count
    with pytest.raises(QuantizationCheckError, match="--compile does not support --quantize fp8"):
        check_quantization("fp8", 1, tmp_path, compiled=True)


def test_shard_counts_that_cut_a_group_are_refused_with_the_ones_that_work():
    check_quantization(None, 1, G128)
    with pytest.raises(QuantizationCheckError, match=r"--num-shard 2 .*group_size 128") as err:
        check_quantization(None, 2, G128)
    assert str(err.value).endswith("--num-shard values that work: 1")
    check_quantization(None, 2, AWQ)  # group 64: 64 inputs of o_proj per shard


def test_unknown_quantization_config_is_named(tmp_path):
    shutil.copy(AWQ / "config.json", tmp_path / "config.json")
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["version"] = "gemv"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(QuantizationCheckError, match="version = 'gemv'"):
        check_quantization(None, 1, tmp_path)


def test_flag_reaches_the_shards_command_line():
    cfg = parse_args(["--quantize", "awq"], LauncherEnv.from_environ({}))
    argv = shard_spec(cfg, AWQ, 0, Programs().shard).argv
    assert argv[argv.index("--quantize") + 1] == "awq"
    plain = shard_spec(parse_args([], LauncherEnv.from_environ({})), AWQ, 0, Programs().shard)
    assert "--quantize" not in plain.argv


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--quantize", "gptq"], "--quantize gptq disagrees with the checkpoint, which is awq"),
        (["--num-shard", "2", "--model-id", str(G128)], "--num-shard values that work: 1"),
        (["--compile"], "--compile does not support quantized checkpoints"),
    ],
)
def test_launcher_exits_1_before_spawning(monkeypatch, capsys, argv, message):
    def no_spawn(*_args, **_kwargs):
        raise AssertionError("a shard was spawned")

    monkeypatch.setattr(launcher_main, "Supervisor", no_spawn)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    args = argv if "--model-id" in argv else ["--model-id", str(AWQ), *argv]
    assert launcher_main.main(args) == 1
    assert message in capsys.readouterr().err


def test_fp8_checkpoints_take_their_flag_and_any_shard_count(tmp_path):
    """FP8 scale blocks never stop a split (a cut inside one is re-blocked at load)."""
    config = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 320,
        "num_attention_heads": 4, "num_key_value_heads": 2,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_quantization("fp8", 2, tmp_path)
    with pytest.raises(QuantizationCheckError, match=r"--quantize awq disagrees .* fp8"):
        check_quantization("awq", 1, tmp_path)
    assert parse_args(["--quantize", "fp8"], LauncherEnv.from_environ({})).quantize == "fp8"
