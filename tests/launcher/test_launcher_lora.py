"""`--lora-adapters`, `--max-loras`, `--max-cpu-loras`, `--max-lora-rank`: parsing and defaults,
refusals before anything is spawned, and the flags on the shards' and the router's command lines
(checked with the shard's and the router's own parsers)."""

import json
from pathlib import Path

import pytest

import launcher.main as launcher_main
from launcher.adapters import AdapterSpec
from launcher.args import parse_args
from launcher.commands import Programs, build_plan
from launcher.env import LauncherEnv
from router.adapters import LoraAdapter as RouterAdapter
from router.args import parse_args as parse_router_args
from shard.__main__ import parse_args as parse_shard_args

CPU_ENV = LauncherEnv.from_environ({"CUDA_VISIBLE_DEVICES": ""})


def adapter_dir(root: Path, name: str, config: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    if config:
        (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    return d


def test_specs_defaults_and_the_environment_fallback():
    cfg = parse_args(["--lora-adapters", "a=/x, b=/y", "--lora-adapters", "org/c"], CPU_ENV)
    assert cfg.lora_adapters == (
        AdapterSpec("a", "/x"),
        AdapterSpec("b", "/y"),
        AdapterSpec("org/c", "org/c"),  # a bare hub id is its own name, as in TGI
    )
    assert (cfg.max_loras, cfg.max_cpu_loras, cfg.max_lora_rank) == (4, 4, 64)
    six = ",".join(f"a{i}=/x{i}" for i in range(6))
    cfg = parse_args(["--lora-adapters", six, "--max-loras", "2"], CPU_ENV)
    assert (cfg.max_loras, cfg.max_cpu_loras) == (2, 6)  # every adapter fits in the host cache
    cfg = parse_args(["--max-loras", "2", "--max-cpu-loras", "2", "--max-lora-rank", "16"], CPU_ENV)
    assert (cfg.lora_adapters, cfg.max_cpu_loras, cfg.max_lora_rank) == ((), 2, 16)

    env = LauncherEnv.from_environ({"CUDA_VISIBLE_DEVICES": "", "LORA_ADAPTERS": "e=/e,f=/f"})
    assert [s.name for s in parse_args([], env).lora_adapters] == ["e", "f"]
    flagged = parse_args(["--lora-adapters", "g=/g"], env)
    assert [s.name for s in flagged.lora_adapters] == ["g"]  # the flag wins


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--lora-adapters", "a=/x,a=/y"], {}, "--lora-adapters: adapter name 'a' is given twice"),
        (["--lora-adapters", "=/x"], {}, "--lora-adapters: '=/x' is not NAME=PATH"),
        (["--lora-adapters", "a="], {}, "--lora-adapters: 'a=' is not NAME=PATH"),
        (["--lora-adapters", "base=/x"], {}, "'base' is reserved for the base model"),
        ([], {"LORA_ADAPTERS": "a=/x,a=/y"}, "LORA_ADAPTERS: adapter name 'a' is given twice"),
        (["--max-loras", "0"], {}, "--max-loras"),
        (["--max-lora-rank", "0"], {}, "--max-lora-rank"),
        (
            ["--max-loras", "8", "--max-cpu-loras", "4"],
            {},
            "--max-cpu-loras (4) must be >= --max-loras (8)",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv, env, message, capsys, monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exc:
        launcher_main.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def no_spawn(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("a child was spawned")

    monkeypatch.setattr(launcher_main, "Supervisor", refuse)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def test_unusable_adapters_are_refused_before_spawning(tmp_path, model_dir, no_spawn, capsys):
    good = adapter_dir(tmp_path, "good")
    empty = adapter_dir(tmp_path, "empty", config=False)
    cases = [
        (f"sql={tmp_path / 'missing'}", f"'{tmp_path / 'missing'}' is not a directory"),
        (f"sql={empty}", f"{empty} has no adapter_config.json (not a PEFT adapter)"),
        (f"tiny={good}", "adapter name 'tiny' is the served model name"),
    ]
    for value, message in cases:
        argv = ["--model-id", str(model_dir), "--served-model-name", "tiny"]
        assert launcher_main.main([*argv, "--lora-adapters", f"ok={good},{value}"]) == 1
        err = capsys.readouterr().err
        assert "--lora-adapters: adapter" in err and message in err


def test_hub_adapters_honour_hf_hub_offline(tmp_path, model_dir, no_spawn, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    argv = ["--model-id", str(model_dir), "--lora-adapters", "x=switchyard-tests/not-cached"]
    assert launcher_main.main(argv) == 1
    err = capsys.readouterr().err
    assert "--lora-adapters: adapter 'x'" in err and "HF_HUB_OFFLINE=1" in err


def test_hub_adapters_are_downloaded_with_their_config_and_weights(tmp_path, monkeypatch):
    from launcher.adapters import resolve_adapters

    calls = []

    def fake_download(repo_id, allow_patterns, local_files_only):
        calls.append((repo_id, tuple(allow_patterns), local_files_only))
        return str(adapter_dir(tmp_path, repo_id.replace("/", "--")))

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_download)
    spec = AdapterSpec("c", "org/c")
    (adapter,) = resolve_adapters([spec], LauncherEnv.from_environ({}))
    assert adapter.path == tmp_path / "org--c"
    assert calls == [("org/c", ("adapter_config.json", "*.safetensors"), False)]


class _Recorder:
    plans: list = []

    def __init__(self, plan, _settings) -> None:
        self.plans.append(plan)

    def request_stop(self) -> None:
        pass

    def run(self) -> int:
        return 0


def test_shards_and_router_get_the_resolved_adapters(tmp_path, model_dir, monkeypatch):
    a, b = adapter_dir(tmp_path, "a"), adapter_dir(tmp_path, "b")
    monkeypatch.setattr(launcher_main, "Supervisor", _Recorder)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(tmp_path)  # relative adapter paths become absolute
    argv = ["--model-id", str(model_dir), "--num-shard", "2", "--lora-adapters", "sql=a"]
    argv += ["--lora-adapters", f"chat={b}", "--max-loras", "1", "--max-lora-rank", "16"]
    _Recorder.plans.clear()
    assert launcher_main.main(argv) == 0
    (plan,) = _Recorder.plans
    listed = f"sql={a},chat={b}"
    for shard in plan.shards:
        settings = parse_shard_args(list(shard.argv[shard.argv.index("serve") :]))
        assert settings.lora_adapters == (("sql", str(a)), ("chat", str(b)))
        assert (settings.max_loras, settings.max_cpu_loras, settings.max_lora_rank) == (1, 2, 16)
        assert shard.argv[shard.argv.index("--lora-adapters") + 1] == listed
    router_argv = list(plan.router.argv)
    router = parse_router_args(router_argv[router_argv.index("--model-id") :])
    assert router.lora_adapters == (RouterAdapter("sql", str(a)), RouterAdapter("chat", str(b)))
    assert router.max_loras == 1


def test_no_adapters_no_lora_flags():
    cfg = parse_args(["--shard-uds-path", "/tmp/s", "--max-loras", "2"], CPU_ENV)
    plan = build_plan(cfg, Path("/m"), Programs(shard=("S",), router=("R",)))
    for argv in (plan.shards[0].argv, plan.router.argv):
        assert not [w for w in argv if "lora" in w]
