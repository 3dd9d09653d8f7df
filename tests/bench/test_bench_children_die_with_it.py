"""A benchmark killed outright (a caller's timeout sends SIGKILL) takes its servers with it: they
are started in their own process group, so the kill does not reach them, but with
launcher.process.TERM_WITH_PARENT they get SIGTERM when their parent dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import bench.servers
import bench.shard
from launcher.process import TERM_WITH_PARENT

pytestmark = pytest.mark.skipif(
    TERM_WITH_PARENT is None, reason="a parent-death signal is Linux's (prctl), whatever the device"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie waiting for init to reap it is gone as far as this test is concerned
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_a_child_started_with_it_dies_when_its_parent_is_killed(tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import subprocess, sys, time
            from launcher.process import TERM_WITH_PARENT
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                     start_new_session=True, preexec_fn=TERM_WITH_PARENT)
            print(child.pid, flush=True)
            time.sleep(120)
        """)],
        stdout=subprocess.PIPE, text=True, cwd=Path(bench.__file__).parents[1],
    )  # fmt: skip
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the child outlived its killed parent"


@pytest.mark.parametrize("module", [bench.shard, bench.servers])
def test_the_benchmarks_start_their_servers_with_it(module, monkeypatch, tmp_path):
    seen: list[dict] = []

    class Recorder:
        def __init__(self, argv, **kwargs):
            seen.append(kwargs)
            self.pid = 0

    monkeypatch.setattr(module.subprocess, "Popen", Recorder)
    if module is bench.shard:
        bench.shard.ShardProcess(tmp_path, "float32", tmp_path / "shard.log")
    else:
        server = bench.servers.ManagedServer(name="s", argv=["x"], port=1, model="m", extra_body={})
        server.start(tmp_path)
    (kwargs,) = seen
    assert kwargs["start_new_session"] and kwargs["preexec_fn"] is TERM_WITH_PARENT
