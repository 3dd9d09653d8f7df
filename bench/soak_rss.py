"""Resident memory of a launcher's router and shards over a soak, sampled with psutil.

The launcher's children are found by their command lines (`python -m router`, `python -m shard`,
as launcher/commands.py spawns them; a shard's rank is its RANK variable), so the soak needs no
help from the server. Each sample records how many requests were answered by then, so the
criteria can pick the samples of a stretch of requests (right after warm-up, the end).
psutil is no dependency of its own: it comes with peft, which the soak needs for its adapter.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class RssSample:
    t: float  # seconds since the sampler started
    done: int  # requests answered when it was taken
    rss: dict[str, int]  # process name ("router", "shard 0", ...) -> bytes


def server_processes(launcher_pid: int) -> dict[str, psutil.Process]:
    procs: dict[str, psutil.Process] = {}
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            argv = child.cmdline()
            module = argv[argv.index("-m") + 1] if "-m" in argv else ""
            if module == "router":
                procs["router"] = child
            elif module == "shard":
                procs[f"shard {child.environ().get('RANK', '0')}"] = child
        except (psutil.Error, IndexError):
            continue  # gone, or not ours to read: not a process the soak measures
    if "router" not in procs or not any(name.startswith("shard") for name in procs):
        raise RuntimeError(f"no router and shard among launcher {launcher_pid}'s children")
    return procs


def sample(procs: dict[str, psutil.Process], t: float, done: int) -> RssSample:
    return RssSample(t, done, {name: p.memory_info().rss for name, p in procs.items()})


async def sample_every(
    procs: dict[str, psutil.Process],
    interval_s: float,
    done: Callable[[], int],
    out: list[RssSample],
    stop: asyncio.Event,
) -> None:
    """Appends a sample every `interval_s` until `stop` is set (reading RSS takes well under a
    millisecond, so the event loop of the client is not disturbed)."""
    t0 = time.monotonic()
    while not stop.is_set():
        out.append(sample(procs, time.monotonic() - t0, done()))
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except asyncio.TimeoutError:
            pass
    out.append(sample(procs, time.monotonic() - t0, done()))
