"""Flag validation, defaults and the command lines built from them."""

from pathlib import Path

import pytest

from launcher.adapters import LoraAdapter
from launcher.args import parse_args
from launcher.commands import Programs, build_plan
from launcher.devices import visible_gpu_count
from launcher.env import LauncherEnv
from launcher.main import main

CPU_ENV = LauncherEnv.from_environ({"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--dtype", "float64"], "--dtype"),
        (["--num-shard", "0"], "--num-shard"),
        (["--num-shard", "two"], "--num-shard"),
        (["--attention", "flash"], "--attention"),
        (["--port", "70000"], "--port"),
        (["--block-size", "-16"], "--block-size"),
        (["--cuda-memory-fraction", "1.5"], "--cuda-memory-fraction"),
        (["--max-concurrent-requests", "0"], "--max-concurrent-requests"),
        (["--max-input-tokens", "100", "--max-total-tokens", "100"], "--max-input-tokens"),
        (
            [
                "--max-input-tokens",
                "100",
                "--max-batch-prefill-tokens",
                "50",
                "--no-prefill-chunking",
            ],
            "--max-batch-prefill-tokens",
        ),
        (["--no-such-flag"], "--no-such-flag"),
        (["--compile", "--num-shard", "2"], "--compile"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_defaults_on_a_cpu_machine():
    cfg = parse_args([], CPU_ENV)
    assert cfg.model_id is None
    assert (cfg.num_shard, cfg.port, cfg.hostname, cfg.dtype) == (1, 3000, "0.0.0.0", "auto")
    # No fixed socket path: launcher.main makes a private one per launcher (test_launcher_sockets).
    assert (cfg.shard_uds_path, cfg.master_addr, cfg.master_port) == (None, "127.0.0.1", 29500)
    with pytest.raises(ValueError, match="socket prefix"):
        build_plan(cfg, Path("/m"), Programs())
    assert cfg.block_size == 16 and cfg.shard_startup_timeout == 300


@pytest.mark.parametrize(("value", "count"), [("", 0), ("-1", 0), ("-1,0", 0), (" ", 0)])
def test_hidden_gpus_count_as_none(value, count):
    assert visible_gpu_count(value) == count


def test_shard_and_router_command_lines():
    cfg = parse_args(
        [
            "--model-id",
            "org/model",
            "--num-shard",
            "2",
            "--attention",
            "torch",
            "--cpu-kv-cache-gb",
            "1.5",
            "--max-best-of",
            "3",
            "--waiting-served-ratio",
            "0.5",
            "--hostname",
            "127.0.0.1",
            "--port",
            "8080",
            "--shard-uds-path",
            "/tmp/switchyard-server",
        ],
        CPU_ENV,
    )
    plan = build_plan(cfg, Path("/models/m"), Programs(shard=("S",), router=("R",)))
    shard = plan.shards[1]
    assert shard.name == "shard 1"
    assert shard.argv == (
        "S",
        "serve",
        "--model-id",
        "/models/m",
        "--uds-path",
        "/tmp/switchyard-server",
        "--dtype",
        "auto",
        "--block-size",
        "16",
        "--attention",
        "torch",
        "--cpu-kv-cache-gb",
        "1.5",
    )
    assert shard.env["RANK"] == "1" and shard.env["WORLD_SIZE"] == "2"
    assert plan.shard_sockets == (
        Path("/tmp/switchyard-server-0"),
        Path("/tmp/switchyard-server-1"),
    )
    assert plan.router.argv == (
        "R",
        "--model-id",
        "/models/m",
        "--shard-uds-path",
        "/tmp/switchyard-server",
        "--hostname",
        "127.0.0.1",
        "--port",
        "8080",
        "--served-model-name",
        "org/model",
        "--shard-connect-timeout",  # the launcher's own startup timeout (default)
        "300.0",
        "--max-best-of",
        "3",
        "--waiting-served-ratio",
        "0.5",
    )


def test_program_overrides_come_from_the_environment():
    env = LauncherEnv.from_environ({"SWITCHYARD_SHARD_COMMAND": "nsys profile python -m shard"})
    assert env.shard_program == ("nsys", "profile", "python", "-m", "shard")
    assert env.router_program is None


def test_router_flags_of_the_production_router_are_forwarded():
    cfg = parse_args(
        [
            "--shard-uds-path", "/tmp/s",
            "--max-batch-size", "8",
            "--payload-limit", "1000",
            "--max-top-n-tokens", "0",
            "--cors-allow-origin", "https://a.example",
            "--cors-allow-origin", "https://b.example",
            "--api-key", "s3cret",
        ],
        CPU_ENV,
    )  # fmt: skip
    router = build_plan(cfg, Path("/m"), Programs(shard=("S",), router=("R",))).router
    argv = " ".join(router.argv)
    assert "--max-batch-size 8" in argv and "--payload-limit 1000" in argv
    assert "--max-top-n-tokens 0" in argv
    assert "--cors-allow-origin https://a.example --cors-allow-origin https://b.example" in argv
    # The key travels in the environment: argv is logged and visible to `ps`.
    assert "s3cret" not in argv and router.env == {"SWITCHYARD_API_KEY": "s3cret"}
    assert parse_args([], CPU_ENV).api_key is None
    plain = parse_args(["--shard-uds-path", "/tmp/s"], CPU_ENV)
    assert build_plan(plain, Path("/m"), Programs()).router.env == {}


def test_compile_reaches_the_shard_command_line():
    cfg = parse_args(["--compile", "--shard-uds-path", "/tmp/s"], CPU_ENV)
    shard = build_plan(cfg, Path("/models/m"), Programs(shard=("S",), router=("R",))).shards[0]
    assert "--compile" in shard.argv
    plain = parse_args(["--shard-uds-path", "/tmp/s"], CPU_ENV)
    assert "--compile" not in build_plan(plain, Path("/m"), Programs()).shards[0].argv
    # LoRA terms run beside the compiled graph (shard/platforms/cpu/compiled.py), so adapters go
    # with it.
    argv = ["--compile", "--lora-adapters", "a=/adapters/a", "--shard-uds-path", "/tmp/s"]
    adapters = (LoraAdapter("a", Path("/adapters/a")),)
    shard = build_plan(parse_args(argv, CPU_ENV), Path("/m"), Programs(), adapters).shards[0]
    assert "--compile" in shard.argv and "--lora-adapters" in shard.argv


def test_overlap_schedule_reaches_the_shards_only_when_given(capsys):
    base = ["--model-id", "org/model", "--shard-uds-path", "/tmp/switchyard-server"]
    programs = Programs(shard=("S",), router=("R",))
    for value in ("on", "off", "auto"):
        cfg = parse_args([*base, "--num-shard", "2", "--overlap-schedule", value], CPU_ENV)
        for shard in build_plan(cfg, Path("/m"), programs).shards:
            assert shard.argv[shard.argv.index("--overlap-schedule") + 1] == value
    plan = build_plan(parse_args(base, CPU_ENV), Path("/m"), programs)
    assert "--overlap-schedule" not in plan.shards[0].argv  # the shard's default: its device's
    with pytest.raises(SystemExit):
        parse_args([*base, "--overlap-schedule", "always"], CPU_ENV)
    assert "--overlap-schedule" in capsys.readouterr().err


def test_cuda_graphs_reach_the_shards_and_a_bad_list_names_the_flag(capsys):
    base = ["--model-id", "org/model", "--shard-uds-path", "/tmp/switchyard-server"]
    for value, forwarded in (("1, 2,8", "1, 2,8"), ("0", "0")):
        cfg = parse_args([*base, "--cuda-graphs", value], CPU_ENV)
        argv = build_plan(cfg, Path("/m"), Programs(shard=("S",), router=("R",))).shards[0].argv
        assert argv[argv.index("--cuda-graphs") + 1] == forwarded.strip()
    cfg = parse_args(base, CPU_ENV)  # not given: the shard decides by its device
    plan = build_plan(cfg, Path("/m"), Programs(shard=("S",), router=("R",)))
    assert "--cuda-graphs" not in plan.shards[0].argv
    for bad in ("1,x", "-4", "0,2"):
        with pytest.raises(SystemExit):
            parse_args([*base, "--cuda-graphs", bad], CPU_ENV)
        assert "--cuda-graphs" in capsys.readouterr().err
