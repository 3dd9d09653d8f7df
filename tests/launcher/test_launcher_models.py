"""Model resolution: local directories and hub ids (offline and failing); GGUF files and the
default model: test_launcher_gguf_models.py."""

from pathlib import Path

import pytest

from launcher.env import LauncherEnv
from launcher.main import main
from launcher.resolve import HUB_ALLOW_PATTERNS, ModelResolutionError, resolve_model


def env(tmp_path: Path, **extra: str) -> LauncherEnv:
    return LauncherEnv.from_environ({"SWITCHYARD_CACHE": str(tmp_path / "cache"), **extra})


def test_local_directory_is_used_as_is(tmp_path, model_dir):
    assert resolve_model(str(model_dir), env(tmp_path)) == model_dir.resolve()


def test_missing_local_path_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(ModelResolutionError, match="no such model directory"):
        resolve_model(str(tmp_path / "nope"), env(tmp_path))


def test_hub_id_offline_fails_naming_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(ModelResolutionError) as exc:
        resolve_model("switchyard-tests/not-cached", env(tmp_path, HF_HUB_OFFLINE="1"))
    assert "switchyard-tests/not-cached" in str(exc.value)
    assert "HF_HUB_OFFLINE" in str(exc.value)


def test_hub_id_network_error_fails_naming_the_model(tmp_path, monkeypatch):
    def unreachable(*args, **kwargs):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr("huggingface_hub.snapshot_download", unreachable)
    with pytest.raises(ModelResolutionError) as exc:
        resolve_model("org/model", env(tmp_path))
    assert "'org/model'" in str(exc.value) and "Name or service not known" in str(exc.value)


def test_hub_id_downloads_weights_configs_and_tokenizer(tmp_path, monkeypatch):
    calls = []

    def fake_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(tmp_path / "snapshot")

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_download)
    assert resolve_model("org/model", env(tmp_path)) == tmp_path / "snapshot"
    ((repo_id, kwargs),) = calls
    assert repo_id == "org/model" and kwargs["local_files_only"] is False
    assert {"*.safetensors", "*.json"} <= set(kwargs["allow_patterns"]) == set(HUB_ALLOW_PATTERNS)


def test_launcher_exits_1_with_the_resolution_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    assert main(["--model-id", "switchyard-tests/not-cached", "--num-shard", "1"]) == 1
    assert "switchyard-tests/not-cached" in capsys.readouterr().err
