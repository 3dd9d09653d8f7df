"""CPU time per thread of running processes over a window, from /proc (Linux).

    .venv/bin/python -m bench.thread_cpu PID [PID ...] [--seconds 30]

On a 2-core machine every busy thread competes with the model's compute threads, so "how much
CPU does the router, or gRPC's poller, burn while the shard decodes" matters as much as where a
profiler says time goes. Threads are named by /proc/<pid>/task/<tid>/comm.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def thread_times(pid: int) -> dict[tuple[int, str], float]:
    """(tid, name) -> CPU seconds (user + system) so far."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of stat(5)
        out[(int(task.name), name)] = (utime + stime) / TICK
    return out


def process_name(pid: int) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return " ".join(a.decode(errors="replace") for a in args[:4])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pids", type=int, nargs="+")
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args(argv)
    before = {pid: thread_times(pid) for pid in args.pids}
    t0 = time.monotonic()
    time.sleep(args.seconds)
    wall = time.monotonic() - t0
    for pid in args.pids:
        after = thread_times(pid)
        used = {k: after[k] - before[pid].get(k, 0.0) for k in after}
        total = sum(used.values())
        cores = total / wall
        print(f"\n{pid} {process_name(pid)}: {total:.1f} CPU s in {wall:.1f} s ({cores:.2f} cores)")
        for (tid, name), sec in sorted(used.items(), key=lambda kv: -kv[1])[:8]:
            if sec > 0:
                print(f"  {sec:7.2f} s  {100 * sec / wall:5.1f}%  {name} ({tid})")


if __name__ == "__main__":
    main()
