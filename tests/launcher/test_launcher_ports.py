"""Busy ports are refused before anything is spawned, in one line naming the flag."""

import socket
from collections.abc import Iterator

import pytest

from launcher.ports import PortUnavailableError, check_ports
from tests.launcher.launcher_process import LauncherProcess, free_port


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.mark.parametrize("hostname", ["127.0.0.1", "0.0.0.0", "localhost"])
def test_a_listening_port_is_refused_naming_the_flag(busy_port, hostname):
    with pytest.raises(PortUnavailableError) as refused:
        check_ports(hostname, busy_port, 1, "127.0.0.1", free_port())
    message = str(refused.value)
    assert message.startswith(f"--port {busy_port}: ")
    address = "0.0.0.0" if hostname == "0.0.0.0" else "127.0.0.1"  # localhost: its IPv4 one
    assert f"{address}:{busy_port} is already in use" in message
    assert "pass another --port" in message and "\n" not in message


def test_free_ports_pass_and_the_rendezvous_port_counts_only_with_several_shards(busy_port):
    check_ports("127.0.0.1", free_port(), 1, "127.0.0.1", busy_port)
    with pytest.raises(PortUnavailableError, match=rf"--master-port {busy_port}: .* in use"):
        check_ports("127.0.0.1", free_port(), 2, "127.0.0.1", busy_port)


def test_an_unknown_hostname_is_named():
    with pytest.raises(PortUnavailableError, match="--hostname no-such-host.invalid: cannot"):
        check_ports("no-such-host.invalid", free_port(), 1, "127.0.0.1", free_port())


def test_launcher_refuses_a_busy_port_before_spawning(
    busy_port, model_dir, sock_prefix, standin_env
):
    args = ["--model-id", str(model_dir), "--shard-uds-path", str(sock_prefix)]
    launcher = LauncherProcess(
        [*args, "--port", str(busy_port), "--hostname", "127.0.0.1"], standin_env
    )
    assert launcher.wait() == 1
    errors = [line for line in launcher.lines if " ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith(
        f"--port {busy_port}: 127.0.0.1:{busy_port} is already in use; stop what listens there "
        "or pass another --port"
    ), launcher.output
    assert "started shard" not in launcher.output and "Traceback" not in launcher.output
