"""Starts the real `launcher` as a subprocess on a free port and waits until it serves."""

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

STARTUP_TIMEOUT_S = 180


def generate_details(url: str, prompt: str, max_new_tokens: int, timeout: float = 120, **params):
    """POST /generate with details; the answer's `details` (asserting a 200)."""
    body = {
        "inputs": prompt,
        "parameters": {"max_new_tokens": max_new_tokens, "details": True, **params},
    }
    response = requests.post(f"{url}/generate", json=body, timeout=timeout)
    assert response.status_code == 200, response.text  # a 424: shards diverged
    return response.json()["details"]


def metric_value(metrics: str, name: str) -> float:
    """A counter's or gauge's value in a /metrics text (`name` with or without `_total`)."""
    match = re.search(rf"^{name}(?:_total)? (\S+)$", metrics, re.MULTILINE)
    assert match, f"{name} is not in /metrics"
    return float(match.group(1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_command() -> list[str]:
    """The installed console script when there is one: that is what users run."""
    script = Path(sys.executable).parent / "launcher"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from launcher.main import main; sys.exit(main())"]


class LauncherProcess:
    def __init__(
        self,
        model_dir: Path | None,
        *extra_args: str,
        env: dict[str, str] | None = None,
        default_sockets: bool = False,
    ) -> None:
        """`env` adds to (or overrides) this process's environment for the launcher's tree.
        `default_sockets`: let the launcher place the shards' sockets, as an operator's does."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._tmp = tempfile.TemporaryDirectory(prefix="switchyard-it-")
        self.log_path = Path(self._tmp.name) / "launcher.log"
        sockets = (
            [] if default_sockets else ["--shard-uds-path", str(Path(self._tmp.name) / "shard")]
        )
        args = [
            *launcher_command(),
            "--port",
            str(self.port),
            "--hostname",
            "127.0.0.1",
            *sockets,
            "--master-port",
            str(free_port()),
            *extra_args,
        ]
        if model_dir is not None:
            args += ["--model-id", str(model_dir)]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self._wait_ready()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def child_pid(self, name: str) -> int:
        """The pid of `shard N` or `router`, from the launcher's "started ..." line."""
        match = re.search(rf"started {name} \(pid (\d+)\)", self.log_text())
        assert match, f"no pid for {name}:\n{self.log_tail()}"
        return int(match.group(1))

    def shard_uds_path(self) -> str:
        """The socket prefix the launcher gave its shards (from shard 0's command line)."""
        match = re.search(r"started shard 0 \(pid \d+\): .* --uds-path (\S+)", self.log_text())
        assert match, self.log_tail()
        return match.group(1)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"launcher exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"launcher not ready after {STARTUP_TIMEOUT_S}s:\n{self.log_tail()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self._tmp.cleanup()
        return self.proc.returncode

    def __enter__(self) -> "LauncherProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
