"""--speculate / --speculative-config on the launcher: checked before anything starts, forwarded
to the router in one form, and the shards' overlap scheduling off with them (each step queued
ahead would run before the router's proposals for it exist)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.args import parse_args
from launcher.commands import Programs, build_plan
from launcher.env import LauncherEnv
from launcher.main import main

CPU_ENV = LauncherEnv.from_environ({"CUDA_VISIBLE_DEVICES": ""})
BASE = ["--model-id", "org/model", "--shard-uds-path", "/tmp/switchyard-server", "--num-shard", "2"]
PROGRAMS = Programs(shard=("S",), router=("R",))


def plan(*argv: str):
    return build_plan(parse_args([*BASE, *argv], CPU_ENV), Path("/m"), PROGRAMS)


def forwarded(argv: tuple[str, ...]) -> dict | None:
    if "--speculative-config" not in argv:
        return None
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_both_flags_reach_the_router_as_one_config_and_turn_overlap_off():
    shorthand = plan("--speculate", "3")
    assert forwarded(shorthand.router.argv) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 5,
        "prompt_lookup_max": 5,
        "disable_by_batch_size": 8,  # ours: router/speculation/config.py
    }
    assert "--speculate" not in shorthand.router.argv
    text = json.dumps(
        {
            "method": "ngram",
            "num_speculative_tokens": 2,
            "prompt_lookup_max": 4,
            "disable_by_batch_size": None,  # vLLM's "never", kept
        }
    )
    full = plan("--speculative-config", text, "--overlap-schedule", "auto")
    assert forwarded(full.router.argv) == {
        "method": "ngram",
        "num_speculative_tokens": 2,
        "prompt_lookup_min": 4,
        "prompt_lookup_max": 4,
        "disable_by_batch_size": None,
    }
    for p in (shorthand, full, plan("--speculate", "1", "--overlap-schedule", "off")):
        for shard in p.shards:
            assert shard.argv[shard.argv.index("--overlap-schedule") + 1] == "off"
            assert "--speculate" not in shard.argv and "--speculative-config" not in shard.argv
    plain = plan()
    assert forwarded(plain.router.argv) is None
    assert "--overlap-schedule" not in plain.shards[0].argv  # the shard's own default


def test_the_router_reads_what_the_launcher_forwards():
    from router.args import parse_args as router_args

    cfg = parse_args(
        [
            *BASE,
            "--speculative-config",
            json.dumps(
                {
                    "model": "[ngram]",
                    "num_speculative_tokens": 5,
                    "prompt_lookup_min": 2,
                    "prompt_lookup_max": 3,
                }
            ),
        ],
        CPU_ENV,
    )
    argv = build_plan(cfg, Path("/m"), PROGRAMS).router.argv
    assert router_args(list(argv[1:])).speculative_config == cfg.speculative_config


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--speculate", "2", "--overlap-schedule", "on"],
            ["--overlap-schedule on", "--speculate"],
        ),
        (
            [
                "--speculative-config",
                '{"method": "ngram", "num_speculative_tokens": 2}',
                "--overlap-schedule",
                "on",
            ],
            ["--overlap-schedule on", "--speculative-config"],
        ),
        (
            [
                "--speculate",
                "2",
                "--speculative-config",
                '{"method": "ngram", "num_speculative_tokens": 2}',
            ],
            ["--speculate and --speculative-config cannot be used together"],
        ),
        (["--speculate", "0"], ["argument --speculate", "between 1 and 16"]),
        (
            ["--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 2}'],
            ["argument --speculative-config", "'eagle3'", "supported: ngram"],
        ),
        (
            ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, "k": 1}'],
            ["argument --speculative-config", "key 'k'", "supported keys"],
        ),
    ],
)
def test_refusals_exit_2_naming_the_flags(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*BASE, *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for word in words:
        assert word in err


def test_a_draft_model_reaches_every_shard_and_the_router():
    text = json.dumps({"model": "./draft", "num_speculative_tokens": 4})
    cfg = parse_args([*BASE, "--speculative-config", text], CPU_ENV)
    p = build_plan(cfg, Path("/m"), PROGRAMS, (), Path("/resolved/draft"))
    for shard in p.shards:
        assert shard.argv[shard.argv.index("--draft-model") + 1] == "/resolved/draft"
        assert shard.argv[shard.argv.index("--overlap-schedule") + 1] == "off"
    assert forwarded(p.router.argv) == {
        "method": "draft_model",
        "model": "./draft",
        "num_speculative_tokens": 4,
        "disable_by_batch_size": 8,
    }
    assert "--draft-model" not in plan("--speculate", "2").shards[0].argv


def test_a_draft_model_that_cannot_be_found_stops_the_launcher_naming_the_flag(tmp_path, caplog):
    from launcher.tiny_models import build_model

    model = build_model(tmp_path / "model")
    text = json.dumps({"model": str(tmp_path / "missing"), "num_speculative_tokens": 2})
    argv = ["--model-id", str(model), "--shard-uds-path", str(tmp_path / "s")]
    assert main([*argv, "--speculative-config", text]) == 1
    assert "--speculative-config model:" in caplog.text
    assert "no such model directory" in caplog.text
