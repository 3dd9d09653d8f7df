"""Starts the shards and the router, waits until each shard answers Health, and keeps them
running together: if any child dies the others are stopped at once; a stop request stops all of
them in order, gracefully.

The router starts beside the shards rather than after them: its imports and its tokenizer take
seconds that the shards' loading then hides, and it waits for their sockets itself
(router/client.py: ShardClient.connect, for --shard-connect-timeout, which the launcher sets to
its own startup timeout)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from launcher.commands import ChildSpec, LaunchPlan
from launcher.health import shard_is_healthy
from launcher.process import Child
from launcher.sockets import SocketPathError, claim_socket_paths

log = logging.getLogger("launcher")

Probe = Callable[[Path, float], bool]


@dataclass(frozen=True)
class SupervisorSettings:
    startup_timeout_s: float = 300.0
    # How long a child gets to exit after SIGTERM before SIGKILL, on a requested stop.
    grace_period_s: float = 10.0
    # The same after a failure, for all children at once. Once one child is dead the others
    # cannot serve (a shard's peers stall in their collectives, the router has lost a shard;
    # its clients already got their errors), and the launcher must exit within 2 s of the death
    # so that an orchestrator restarts it: on a loaded machine they rarely finish in time anyway.
    failure_grace_s: float = 0.5
    poll_interval_s: float = 0.1
    # Per-attempt bound, so a shard that accepted the connection but hangs cannot stall the loop.
    probe_timeout_s: float = 2.0
    error_tail_lines: int = 20


class LaunchFailed(RuntimeError):
    """Why the launcher gives up: `summary` is one line, logged at once; the last log lines of
    the children to blame follow once the others are stopped, so that they end the output."""

    def __init__(self, summary: str, blame: Sequence[Child] = ()) -> None:
        super().__init__(summary)
        self.summary = summary
        self.blame = tuple(blame)


class StartupFailed(LaunchFailed):
    pass


class ChildExited(LaunchFailed):
    pass


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# How the router states why it gave up, last on its stderr (router/__main__.py): e.g. which
# shard stopped answering a step.
ROUTER_ERROR = "router: error: "
# The router's exit status then (router/__main__.py: EXIT_SHARDS_LOST).
ROUTER_SHARDS_LOST = 4


def router_reason(router: Child) -> str:
    """': <why>' from the router's last error line, or '' when it wrote none."""
    for line in reversed(router.tail(5)):
        if line.startswith(ROUTER_ERROR):
            return ": " + line.removeprefix(ROUTER_ERROR)
    return ""


def format_tail(child: Child, n: int) -> str:
    lines = child.tail(n)
    if not lines:
        return f"{child.name} printed nothing"
    return f"last {len(lines)} log lines of {child.name}:\n" + "\n".join(
        f"    {ln}" for ln in lines
    )


class Supervisor:
    def __init__(
        self,
        plan: LaunchPlan,
        settings: SupervisorSettings,
        *,
        probe: Probe = shard_is_healthy,
        sink: TextIO | None = None,
    ) -> None:
        self.plan = plan
        self.settings = settings
        self._probe = probe
        self._sink = sink if sink is not None else sys.stdout
        self._sink_lock = threading.Lock()
        self._stop = threading.Event()
        self._force = threading.Event()
        self._shards: list[Child] = []
        self._router: Child | None = None
        self._sockets_claimed = False

    def request_stop(self) -> None:
        """Safe from a signal handler. A second request skips the grace period."""
        if self._stop.is_set():
            self._force.set()
        self._stop.set()

    def run(self) -> int:
        """Returns the launcher's exit code: 0 after a requested stop, 1 after any failure."""
        try:
            self._claim_sockets()
            for spec in self.plan.shards:
                self._shards.append(self._spawn(spec))
            self._router = self._spawn(self.plan.router)
            if not self._wait_for_shards():
                return 0
            log.info("all %d shard(s) ready", len(self._shards))
            self._supervise()
            log.info("stop requested: shutting down")
            return 0
        except LaunchFailed as exc:
            others = any(c.poll() is None for c in self._children())
            log.error("%s%s", exc.summary, "; stopping the others" if others else "")
            self._stop_children(self.settings.failure_grace_s, all_at_once=True)
            if exc.blame:
                n = self.settings.error_tail_lines
                tails = "\n".join(format_tail(child, n) for child in exc.blame)
                log.error("%s; %s", exc.summary, tails)
            return 1
        finally:
            self._stop_children(self.settings.grace_period_s, all_at_once=False)
            self._release_sockets()

    def _children(self) -> list[Child]:
        return [*self._shards, *([self._router] if self._router else [])]

    def _spawn(self, spec: ChildSpec) -> Child:
        try:
            child = Child(spec, self._sink, self._sink_lock)
        except OSError as exc:  # e.g. a wrong SWITCHYARD_SHARD_COMMAND
            raise StartupFailed(
                f"could not start {spec.name} ({' '.join(spec.argv)}): {exc}"
            ) from exc
        log.info("started %s (pid %d): %s", spec.name, child.pid, " ".join(spec.argv))
        return child

    def _wait_for_shards(self) -> bool:
        """True when every shard answers Health; False when a stop was requested first."""
        timeout = self.settings.startup_timeout_s
        deadline = time.monotonic() + timeout
        pending = dict(enumerate(self._shards))
        while pending:
            if self._stop.is_set():
                return False
            self._check_alive(during_startup=True)
            for rank, child in list(pending.items()):
                remaining = max(0.05, deadline - time.monotonic())
                if self._probe(
                    self.plan.shard_sockets[rank], min(self.settings.probe_timeout_s, remaining)
                ):
                    log.info("%s is ready", child.name)
                    del pending[rank]
            if pending and time.monotonic() >= deadline:
                raise StartupFailed(
                    "; ".join(self._not_ready(r, child, timeout) for r, child in pending.items()),
                    blame=list(pending.values()),
                )
            if pending:
                self._stop.wait(self.settings.poll_interval_s)
        return True

    def _not_ready(self, rank: int, child: Child, timeout: float) -> str:
        socket = self.plan.shard_sockets[rank]
        state = "exists but Health did not answer" if socket.exists() else "was never created"
        return f"{child.name} did not become ready within {timeout:g} s (socket {socket} {state})"

    def _supervise(self) -> None:
        while not self._stop.is_set():
            self._check_alive(during_startup=False)
            self._stop.wait(self.settings.poll_interval_s)

    def _check_alive(self, *, during_startup: bool) -> None:
        for child in self._children():
            code = child.poll()
            if code is None:
                continue
            # The router has no readiness of its own here: it serves once the shards do.
            shard_starting = during_startup and child is not self._router
            when = "before it became ready" if shard_starting else "unexpectedly"
            error = StartupFailed if during_startup else ChildExited
            # Even exit code 0 is a failure: a server process has no reason to finish on its own.
            summary = f"{child.name} {describe_exit(code)} {when}"
            if child is self._router and code == ROUTER_SHARDS_LOST:
                summary += router_reason(child)
            raise error(summary, blame=[child])

    def _stop_children(self, grace_s: float, *, all_at_once: bool) -> None:
        # A requested stop takes the router first, so it stops taking requests before the shards
        # under it disappear; after a failure nothing is served any more and time counts.
        shards, router = self._shards, [self._router] if self._router else []
        groups = [router + shards] if all_at_once else [router, shards]
        for group in groups:
            running = [c for c in group if c.poll() is None]
            for child in running:
                child.signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while any(c.poll() is None for c in running):
                if self._force.is_set() or time.monotonic() >= deadline:
                    break
                time.sleep(0.02)
            late = [c for c in running if c.poll() is None]
            for child in late:
                log.warning(
                    "%s did not exit within %g s of SIGTERM; killing it", child.name, grace_s
                )
                child.signal(signal.SIGKILL)
            for child in late:
                child.wait(5.0)

    def _claim_sockets(self) -> None:
        try:
            claim_socket_paths(self.plan.shard_sockets)
        except SocketPathError as exc:
            raise StartupFailed(str(exc)) from None
        self._sockets_claimed = True

    def _release_sockets(self) -> None:
        # Only sockets this launcher's shards served: one that was refused as live is another
        # server's.
        if self._sockets_claimed:
            for path in self.plan.shard_sockets:
                if not path.is_dir():
                    path.unlink(missing_ok=True)
