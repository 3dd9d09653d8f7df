"""--tool-call-parser, --enable-auto-tool-choice and --reasoning-parser: the launcher takes
vLLM's flags, refuses what cannot work before anything starts, and hands them to the router,
whose names match the parsers it has."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.args import parse_args
from launcher.commands import Programs, build_plan
from router.args import REASONING_PARSERS, TOOL_CALL_PARSERS
from router.args import parse_args as router_args
from router.reasoning.registry import REASONING_PARSERS as REASONING_REGISTRY
from router.reasoning.registry import reasoning_parser
from router.tool_calls.registry import TOOL_PARSERS, tool_parser
from tests.launcher.test_launcher_args import CPU_ENV


def test_every_flag_value_names_a_parser():
    # and every parser is a flag value: a parser the flags lack could never be chosen
    assert set(TOOL_CALL_PARSERS) == set(TOOL_PARSERS)
    assert set(REASONING_PARSERS) == set(REASONING_REGISTRY)
    for name in TOOL_CALL_PARSERS:
        assert tool_parser(name).name == name
    for name in REASONING_PARSERS:
        assert reasoning_parser(name).name == name
    with pytest.raises(ValueError, match="hermes"):
        tool_parser("xml")


def test_flags_reach_the_router_only_when_given():
    flags = ["--tool-call-parser", "llama3_json", "--enable-auto-tool-choice",
             "--reasoning-parser", "deepseek_r1"]  # fmt: skip
    cfg = parse_args(["--shard-uds-path", "/tmp/s", *flags], CPU_ENV)
    argv = build_plan(cfg, Path("/m"), Programs(shard=("S",), router=("R",))).router.argv
    args = router_args(list(argv[1:]))
    assert (args.tool_call_parser, args.enable_auto_tool_choice, args.reasoning_parser) == (
        "llama3_json", True, "deepseek_r1")  # fmt: skip
    plain = parse_args(["--shard-uds-path", "/tmp/s"], CPU_ENV)
    argv = build_plan(plain, Path("/m"), Programs(router=("R",))).router.argv
    assert not {"--tool-call-parser", "--enable-auto-tool-choice", "--reasoning-parser"} & set(argv)


@pytest.mark.parametrize(
    "flags,says",
    [
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
        (["--tool-call-parser", "xml"], "invalid choice: 'xml'"),
        (["--reasoning-parser", "o1"], "invalid choice: 'o1'"),
    ],
)
def test_refused_before_anything_starts(flags, says, capsys):
    for parse in (lambda: parse_args(flags, CPU_ENV), lambda: router_args(
            ["--model-id", "m", "--shard-uds-path", "/s", *flags])):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            parse()
        assert exit_.value.code == 2 and says in capsys.readouterr().err
