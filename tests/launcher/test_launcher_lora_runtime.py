"""`--enable-lora-runtime-loading` and `--lora-dir`: refused without each other's sense, and the
children's command lines (read back with the shard's and the router's own parsers): shards able
to take adapters with none at startup, a router with the routes on and the directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import launcher.main as launcher_main
from launcher.args import parse_args
from launcher.commands import Programs, build_plan
from launcher.env import LauncherEnv
from router.args import parse_args as parse_router_args
from shard.__main__ import parse_args as parse_shard_args

CPU_ENV = LauncherEnv.from_environ({"CUDA_VISIBLE_DEVICES": ""})
PROGRAMS = Programs(shard=("S",), router=("R",))


def _plan(argv: list[str], model_dir: Path):
    cfg = parse_args(["--shard-uds-path", "/tmp/s", "--num-shard", "2", *argv], CPU_ENV)
    return build_plan(cfg, model_dir, PROGRAMS)


def _shard(argv: tuple[str, ...]):
    return parse_shard_args(list(argv[argv.index("serve") :]))


def _router(argv: tuple[str, ...]):
    return parse_router_args(list(argv[argv.index("--model-id") :]))


def test_runtime_loading_reaches_the_shards_and_the_router(tmp_path, model_dir, monkeypatch):
    (tmp_path / "loras").mkdir()
    monkeypatch.chdir(tmp_path)  # a relative --lora-dir becomes absolute
    argv = ["--enable-lora-runtime-loading", "--lora-dir", "loras", "--max-loras", "2"]
    plan = _plan([*argv, "--max-lora-rank", "16"], model_dir)
    for shard in plan.shards:
        settings = _shard(shard.argv)
        assert settings.enable_lora and settings.lora_adapters == ()
        assert (settings.max_loras, settings.max_cpu_loras, settings.max_lora_rank) == (2, 2, 16)
        assert "--lora-dir" not in shard.argv
        assert "--enable-lora-runtime-loading" not in shard.argv
    router = _router(plan.router.argv)
    assert router.enable_lora_runtime_loading and router.lora_dir == str(tmp_path / "loras")
    assert (router.lora_adapters, router.max_loras) == ((), 2)


def test_without_the_flag_nothing_changes(tmp_path, model_dir):
    # --lora-dir alone has no effect (like --max-loras without adapters).
    plan = _plan(["--lora-dir", str(tmp_path)], model_dir)
    for argv in (plan.shards[0].argv, plan.router.argv):
        assert not [w for w in argv if w.startswith("--") and "lora" in w]
    assert not _router(plan.router.argv).enable_lora_runtime_loading


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--enable-lora-runtime-loading"],
            "--enable-lora-runtime-loading needs --lora-dir DIR",
        ),
        (["--lora-dir", "/nonexistent/loras"], "--lora-dir: /nonexistent/loras is not a directory"),
    ],
)
def test_bad_combinations_exit_2_naming_the_flags(argv, message, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SystemExit) as exc:
        launcher_main.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_lora_dir_must_be_a_directory_not_a_file(tmp_path, capsys):
    file = tmp_path / "f"
    file.write_text("")
    with pytest.raises(SystemExit):
        parse_args(["--enable-lora-runtime-loading", "--lora-dir", str(file)], CPU_ENV)
    assert f"--lora-dir: {file} is not a directory" in capsys.readouterr().err
    assert os.path.isfile(file)
