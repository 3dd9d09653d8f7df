"""--prefix-caching / --no-prefix-caching reach the router only when given (its default: on,
but off for a model with linear attention: router/model_fit.py)."""

from pathlib import Path

import pytest

from launcher.args import parse_args
from launcher.commands import Programs, build_plan
from launcher.env import LauncherEnv
from router.args import parse_args as router_args

CPU_ENV = LauncherEnv.from_environ({"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize(
    ("flags", "forwarded", "router_value"),
    [
        ([], [], None),
        (["--prefix-caching"], ["--prefix-caching"], True),
        (["--no-prefix-caching"], ["--no-prefix-caching"], False),
    ],
)
def test_prefix_caching_flag_is_forwarded_when_given(flags, forwarded, router_value):
    cfg = parse_args(["--shard-uds-path", "/tmp/s", *flags], CPU_ENV)
    argv = build_plan(cfg, Path("/m"), Programs(shard=("S",), router=("R",))).router.argv
    assert [a for a in argv if "prefix-caching" in a] == forwarded
    assert (
        router_args(["--model-id", "/m", "--shard-uds-path", "/s", *forwarded]).prefix_caching
        is router_value
    )


def test_a_value_for_the_switch_is_refused_naming_it(capsys):
    with pytest.raises(SystemExit) as exc:
        router_args(["--model-id", "/m", "--shard-uds-path", "/s", "--prefix-caching=yes"])
    assert exc.value.code == 2 and "--prefix-caching" in capsys.readouterr().err
