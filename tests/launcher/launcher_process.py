"""Runs the real `python -m launcher` as a subprocess and collects its output line by line."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).parent / "standins"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_args(model_dir: Path, sock: Path, *extra: str) -> list[str]:
    """The launcher checks its ports before spawning (the rendezvous port with several shards):
    free ones, though the stand-ins never bind them."""
    args = ["--model-id", str(model_dir), "--shard-uds-path", str(sock)]
    args += ["--port", str(free_port())]
    if "--master-port" not in extra:
        args += ["--master-port", str(free_port())]
    return [*args, *extra]


def records(env: dict[str, str]) -> dict[str, dict]:
    """What each stand-in child recorded of its command line and environment, by name."""
    return {p.stem: json.loads(p.read_text()) for p in Path(env["FAKE_PID_DIR"]).glob("*.json")}


class LauncherProcess:
    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "launcher", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_for_line(self, needle: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not any(needle in line for line in self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"no line containing {needle!r}; output:\n{self.output}")
                self._changed.wait(min(left, 0.2))

    def child_pid(self, name: str) -> int:
        """From the launcher's "started NAME (pid N)" line: there even for a child that was
        stopped before it could record anything itself."""
        match = re.search(rf"started {name} \(pid (\d+)\)", self.output)
        assert match, f"no pid for {name}:\n{self.output}"
        return int(match.group(1))

    def wait(self, timeout: float = 20.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes once its parent exited.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False
