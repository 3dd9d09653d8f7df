"""The readiness probe against a stand-in shard: socket first, then a real Health answer."""

import os
import subprocess
import sys
import time

from launcher.health import shard_is_healthy
from tests.launcher.launcher_process import REPO_ROOT, STANDINS


def test_probe_waits_for_the_socket_and_for_health(sock_prefix, model_dir):
    socket = sock_prefix.parent / "shard-0"
    assert not shard_is_healthy(socket)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "FAKE_SHARD_UNHEALTHY_FOR_S": "1.5"}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(STANDINS / "fake_shard.py"),
            "serve",
            "--model-id",
            str(model_dir),
            "--uds-path",
            str(sock_prefix),
        ],
        env=env,
    )
    try:
        deadline = time.monotonic() + 10
        while not socket.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert socket.exists()
        assert not shard_is_healthy(socket, 1.0), "socket alone must not count as ready"
        while not shard_is_healthy(socket, 1.0) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert shard_is_healthy(socket, 1.0)
    finally:
        proc.terminate()
        proc.wait(10)
