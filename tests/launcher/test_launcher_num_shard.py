"""`--num-shard`: its default, and the errors raised before any shard is spawned."""

import json
from pathlib import Path

import pytest
import torch

import launcher.main as launcher_main
from launcher.args import parse_args
from launcher.checks import ShardCountError, check_num_shard
from launcher.devices import default_num_shard
from launcher.env import LauncherEnv


def model(tmp_path: Path, **config) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["X"], **config}))
    return tmp_path


def gpus(n: int):
    return lambda _visible: n


@pytest.mark.parametrize(
    ("visible", "torch_count", "expected"),
    [
        (None, 0, 1),  # a CPU machine
        ("0,1", 0, 1),  # ids listed, but no driver: still the CPU
        (None, 4, 4),
        ("0,1", 2, 2),  # torch.cuda honours CUDA_VISIBLE_DEVICES
        ("-1", 4, 1),  # "-1" hides every GPU without asking torch
        ("", 4, 1),
    ],
)
def test_default_is_the_visible_gpus_or_one(monkeypatch, tmp_path, visible, torch_count, expected):
    monkeypatch.setattr("launcher.devices.NVIDIA_DRIVER_GPUS", tmp_path)  # a driver is loaded
    monkeypatch.setattr(torch.cuda, "device_count", lambda: torch_count)
    assert default_num_shard(visible) == expected
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert parse_args([], LauncherEnv.from_environ(env)).num_shard == expected


@pytest.mark.parametrize("visible", [None, "0,1"])
def test_without_the_nvidia_driver_torch_is_not_asked(monkeypatch, tmp_path, visible):
    monkeypatch.setattr("launcher.devices.NVIDIA_DRIVER_GPUS", tmp_path / "absent")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: pytest.fail("torch was asked"))
    assert default_num_shard(visible) == 1


def test_more_shards_than_gpus_is_refused(tmp_path):
    with pytest.raises(ShardCountError, match=r"--num-shard 4 .* only 2 GPU\(s\)") as err:
        check_num_shard(4, model(tmp_path, num_attention_heads=8), "0,1", gpus(2))
    assert "--num-shard 2 or fewer" in str(err.value)
    check_num_shard(2, model(tmp_path, num_attention_heads=8), "0,1", gpus(2))


def test_cpu_takes_any_count_that_divides_the_heads(tmp_path):
    check_num_shard(8, model(tmp_path, num_attention_heads=8), None, gpus(0))


def test_heads_must_divide(tmp_path):
    path = model(tmp_path, num_attention_heads=12, num_key_value_heads=4)
    with pytest.raises(
        ShardCountError, match=r"--num-shard 5 does not divide .* 12 attention heads"
    ):
        check_num_shard(5, path, None, gpus(0))
    with pytest.raises(ShardCountError, match="1, 2, 3, 4, 6, 12"):
        check_num_shard(8, path, None, gpus(0))


def test_each_layers_own_heads_must_divide(tmp_path):
    """Laguna counts its query heads a layer (num_attention_heads_per_layer)."""
    path = model(tmp_path, num_attention_heads=48, num_key_value_heads=8,
                 num_attention_heads_per_layer=[48, 64, 64, 40])  # fmt: skip
    check_num_shard(8, path, None, gpus(0))
    with pytest.raises(
        ShardCountError,
        match=r"--num-shard 16 does not divide the 40 attention heads of layer 3 "
        r"\(num_attention_heads_per_layer .*: pass one of 1, 2, 4, 8$",
    ):
        check_num_shard(16, path, None, gpus(0))


def test_kv_heads_split_or_replicate(tmp_path):
    check_num_shard(4, model(tmp_path, num_attention_heads=8, num_key_value_heads=1), None, gpus(0))
    check_num_shard(4, model(tmp_path, num_attention_heads=8, num_key_value_heads=2), None, gpus(0))
    path = model(tmp_path, num_attention_heads=12, num_key_value_heads=3)
    with pytest.raises(ShardCountError, match=r"--num-shard 2 .* 3 key/value heads"):
        check_num_shard(2, path, None, gpus(0))


def test_gpt2_field_names_count_the_heads(tmp_path):
    """StarCoder's config.json (GPTBigCode) says n_head, and multi_query for its one KV head."""
    starcoder = model(tmp_path, n_head=48, multi_query=True)
    check_num_shard(8, starcoder, None, gpus(0))  # the one KV head on every shard
    with pytest.raises(ShardCountError, match=r"--num-shard 5 does not divide .* 48 attention"):
        check_num_shard(5, starcoder, None, gpus(0))
    with pytest.raises(ShardCountError, match=r"--num-shard 8 does not divide .* 12 attention"):
        check_num_shard(8, model(tmp_path, n_head=12, multi_query=False), None, gpus(0))
    # Falcon's new decoder architecture: its KV heads are num_kv_heads (96 query heads in 6
    # groups here)
    falcon = model(tmp_path, num_attention_heads=96, num_kv_heads=6, new_decoder_architecture=True)
    check_num_shard(12, falcon, None, gpus(0))  # each KV head on two shards
    with pytest.raises(ShardCountError, match=r"--num-shard 4 cannot share .* 6 key/value heads"):
        check_num_shard(4, falcon, None, gpus(0))


def test_mamba_heads_split_and_groups_split_or_replicate(tmp_path):
    """Granite 4.0-H's one group is read by every shard; NemotronH's 8 split or replicate."""
    granite = model(tmp_path, num_attention_heads=8, mamba_n_heads=6, mamba_n_groups=1)
    check_num_shard(2, granite, None, gpus(0))
    with pytest.raises(ShardCountError, match=r"--num-shard 4 .* 6 Mamba heads.*: pass one of 1"):
        check_num_shard(4, granite, None, gpus(0))
    nemotron = tmp_path / "nemotron"
    nemotron.mkdir()
    model(nemotron, num_attention_heads=48, mamba_num_heads=48, n_groups=8)
    check_num_shard(4, nemotron, None, gpus(0))
    check_num_shard(16, model(nemotron, mamba_num_heads=48, n_groups=8), None, gpus(0))
    with pytest.raises(ShardCountError, match=r"--num-shard 6 cannot share .* 8 Mamba groups"):
        check_num_shard(6, nemotron, None, gpus(0))
    # pure Mamba 2 (Codestral Mamba): num_heads and n_groups, no attention heads at all
    mamba2 = tmp_path / "mamba2"
    mamba2.mkdir()
    model(mamba2, model_type="mamba2", num_heads=128, n_groups=8)
    check_num_shard(8, mamba2, None, gpus(0))
    with pytest.raises(ShardCountError, match=r"--num-shard 3 .* 128 Mamba heads \(num_heads"):
        check_num_shard(3, mamba2, None, gpus(0))


def test_mamba1_channels_split(tmp_path):
    """Mamba 1's inner channels (expand x hidden_size; Jamba's mamba_expand) split."""
    mamba = model(tmp_path, model_type="mamba", hidden_size=768, expand=2)  # mamba-130m
    check_num_shard(8, mamba, None, gpus(0))
    with pytest.raises(ShardCountError, match=r"--num-shard 7 .* 1536 Mamba channels \(expand"):
        check_num_shard(7, mamba, None, gpus(0))
    jamba = tmp_path / "jamba"
    jamba.mkdir()
    model(jamba, model_type="jamba", hidden_size=20, mamba_expand=2, num_attention_heads=6)
    with pytest.raises(ShardCountError, match=r"--num-shard 3 .* 40 Mamba channels \(mamba_exp"):
        check_num_shard(3, jamba, None, gpus(0))


def test_kda_heads_split(tmp_path):
    """Kimi Linear's KDA heads: as transformers saves them, or in Moonshot's nested config."""
    saved = model(tmp_path, model_type="kimi_linear", num_attention_heads=8, linear_num_heads=6)
    check_num_shard(2, saved, None, gpus(0))
    with pytest.raises(ShardCountError, match=r"--num-shard 4 .* 6 Kimi Delta Attention heads"):
        check_num_shard(4, saved, None, gpus(0))
    released = tmp_path / "released"
    released.mkdir()
    model(released, num_attention_heads=32, linear_attn_config={"num_heads": 12})
    with pytest.raises(ShardCountError, match=r"heads \(linear_attn_config\.num_heads in"):
        check_num_shard(8, released, None, gpus(0))


def test_a_config_without_head_counts_is_left_to_the_shard(tmp_path):
    check_num_shard(3, model(tmp_path), None, gpus(0))
    check_num_shard(3, tmp_path / "missing", None, gpus(0))


def test_launcher_exits_1_before_spawning(tmp_path, monkeypatch, capsys):
    def no_spawn(*_args, **_kwargs):
        raise AssertionError("a shard was spawned")

    monkeypatch.setattr(launcher_main, "Supervisor", no_spawn)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    path = model(tmp_path, num_attention_heads=4)
    assert launcher_main.main(["--model-id", str(path), "--num-shard", "3"]) == 1
    assert "--num-shard 3 does not divide the model's 4 attention heads" in capsys.readouterr().err
