"""One supervised child process: spawned in its own process group, its output forwarded with a
prefix and the last lines kept for error messages."""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from launcher.commands import ChildSpec

TAIL_LINES = 100


def _parent_death_signal() -> Callable[[], None] | None:
    """Makes a child receive SIGTERM when its parent dies, even by SIGKILL (Linux only).

    Without it, a launcher killed by the OOM killer would orphan shards holding GPU memory.
    The ctypes function is looked up here, before fork, so the child only makes one syscall.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_pdeathsig() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)

    return set_pdeathsig


# preexec_fn for a child that must not outlive its parent (the launcher's children, the
# benchmarks' servers); None where the platform has no such signal.
TERM_WITH_PARENT = _parent_death_signal()


class Child:
    def __init__(self, spec: ChildSpec, sink: TextIO, sink_lock: threading.Lock) -> None:
        self.spec = spec
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._tail_lock = threading.Lock()
        self._sink = sink
        self._sink_lock = sink_lock
        # Own session: a Ctrl-C in the terminal reaches only the launcher, which then stops the
        # children in order (router first) instead of all of them racing each other.
        self._proc = subprocess.Popen(
            spec.argv,
            env={**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=TERM_WITH_PARENT,
        )
        self._pump = threading.Thread(target=self._forward, name=f"log {spec.name}", daemon=True)
        self._pump.start()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        return self._proc.pid

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: int) -> None:
        """Signals the child's whole process group (it may have started helpers of its own)."""
        if self._proc.poll() is not None:
            return
        try:
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:
            pass

    def tail(self, n: int = 20) -> list[str]:
        # Let the pump drain what a just-exited child wrote last: that line is usually the error.
        if self._proc.poll() is not None:
            self._pump.join(timeout=1.0)
        with self._tail_lock:
            return list(self._tail)[-n:]

    def _forward(self) -> None:
        assert self._proc.stdout is not None
        prefix = f"[{self.spec.name}] "
        for raw in self._proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            with self._tail_lock:
                self._tail.append(line)
            with self._sink_lock:
                try:
                    self._sink.write(prefix + line + "\n")
                    self._sink.flush()
                except (OSError, ValueError):
                    pass  # a closed terminal must not stop the tail from filling
        self._proc.stdout.close()
