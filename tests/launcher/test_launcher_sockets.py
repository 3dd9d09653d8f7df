"""Shard sockets: a private default per launcher, and a live socket is never taken over."""

import os
import socket
import stat
from pathlib import Path

import pytest

from launcher.sockets import (
    SocketPathError,
    check_socket_paths,
    claim_socket_paths,
    private_socket_prefix,
    socket_is_live,
)
from tests.launcher.launcher_process import LauncherProcess, free_port, launcher_args, records


def listening(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    return server


def test_live_stale_and_plain_files(sock_prefix: Path):
    sock_prefix.parent.mkdir(exist_ok=True)
    live, stale, plain = (sock_prefix.parent / name for name in ("live", "stale", "plain"))
    with listening(live):
        leftover = listening(stale)
        leftover.close()  # what a crashed server leaves: the file, nobody listening
        plain.write_text("not a socket")
        assert socket_is_live(live)
        assert not socket_is_live(stale) and stale.exists()
        assert not socket_is_live(plain)
        assert not socket_is_live(sock_prefix.parent / "missing")

        with pytest.raises(SocketPathError) as refused:
            claim_socket_paths([stale, live])
        assert f"shard socket {live} is in use" in str(refused.value)
        assert "--shard-uds-path" in str(refused.value)
        assert live.exists() and stale.exists()  # a refusal removes nothing
        claim_socket_paths([stale, plain])
        assert not stale.exists() and not plain.exists()


def test_paths_that_cannot_be_sockets_are_refused_by_flag(sock_prefix: Path):
    long_path = Path("/tmp") / ("x" * 120)
    with pytest.raises(SocketPathError, match=r"more than the 107 .* --shard-uds-path"):
        check_socket_paths([long_path])
    sock_prefix.parent.joinpath("dir").mkdir(parents=True)
    with pytest.raises(SocketPathError, match="is a directory; pass another --shard-uds-path"):
        check_socket_paths([sock_prefix.parent / "dir"])


def test_private_prefixes_differ_and_are_removed():
    with private_socket_prefix() as a, private_socket_prefix() as b:
        assert a != b
        directory = Path(a).parent
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700  # no other user can plant a file
        assert len(os.fsencode(f"{a}-15")) <= 107
    assert not directory.exists() and not Path(b).parent.exists()


def test_second_launcher_on_a_live_socket_is_refused_and_the_first_keeps_serving(
    model_dir, sock_prefix, standin_env, tmp_path
):
    first = LauncherProcess(launcher_args(model_dir, sock_prefix, "--num-shard", "2"), standin_env)
    try:
        first.wait_for_line("[router] router listening")
        second_env = {**standin_env, "FAKE_PID_DIR": str(tmp_path)}  # its own records, if any
        second = LauncherProcess(
            launcher_args(model_dir, sock_prefix, "--num-shard", "2"), second_env
        )
        assert second.wait() == 1
        errors = [line for line in second.lines if " ERROR " in line]
        assert len(errors) == 1, second.output
        assert f"shard socket {sock_prefix}-0 is in use" in errors[0]
        assert "--shard-uds-path" in errors[0]
        assert "started shard" not in second.output  # refused before spawning anything
        # The first server's sockets are untouched and still answer.
        assert socket_is_live(Path(f"{sock_prefix}-0")) and socket_is_live(Path(f"{sock_prefix}-1"))
        assert first.proc.poll() is None
    finally:
        first.terminate()
    assert first.wait() == 0, first.output


def test_launchers_with_default_paths_do_not_share_sockets(model_dir, standin_env, tmp_path):
    started: list[LauncherProcess] = []

    def start(name: str) -> tuple[LauncherProcess, str]:
        env = {**standin_env, "FAKE_PID_DIR": str(tmp_path / name)}
        (tmp_path / name).mkdir()
        launcher = LauncherProcess(["--model-id", str(model_dir), "--port", str(free_port())], env)
        started.append(launcher)
        launcher.wait_for_line("[router] router listening")
        argv = records(env)["shard-0"]["argv"]
        return launcher, argv[argv.index("--uds-path") + 1]

    try:
        a, a_prefix = start("a")
        b, b_prefix = start("b")
        assert a_prefix != b_prefix
        assert "removing stale socket" not in a.output + b.output
        b.terminate()
        assert b.wait() == 0, b.output
        assert not Path(b_prefix).parent.exists()  # B's private directory went with it
        assert socket_is_live(Path(f"{a_prefix}-0")) and a.proc.poll() is None
        a.terminate()
        assert a.wait() == 0, a.output
        assert not Path(a_prefix).parent.exists()
    finally:
        for launcher in started:
            if launcher.proc.poll() is None:
                launcher.terminate()
                launcher.wait()
