"""Top frames of a py-spy profile as text: where a process's time goes, no flamegraph viewer.

    py-spy record -p PID -d 20 -r 100 --format raw --threads -o prof.raw
    .venv/bin/python -m bench.pyspy_top prof.raw [--top 25] [--thread NAME] [--idle]

Raw (collapsed) lines are `frame;frame;...;leaf COUNT`, root first. Self time counts the leaf,
inclusive time every distinct frame on the stack. Idle frames (a thread waiting in select,
epoll, a lock or a queue) are dropped unless --idle: they are time nothing ran.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

IDLE_FUNCTIONS = (
    "select poll epoll_wait _worker wait acquire get _wait_for_tstate_lock sleep accept "
    "recv_into readinto"
)
IDLE = re.compile(r"\b(" + "|".join(IDLE_FUNCTIONS.split()) + r")\b \(")


def parse(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def short(frame: str) -> str:
    """`fn (path/to/file.py:12)` -> `fn (file.py:12)`."""
    return re.sub(r"\(([^()]*/)?([^/()]+)\)$", r"(\2)", frame.strip())


def summarize(
    stacks: list[tuple[list[str], int]], thread: str | None, idle: bool
) -> tuple[Counter, Counter, int]:
    self_t: Counter = Counter()
    incl: Counter = Counter()
    total = 0
    for frames, n in stacks:
        if thread and not any(thread in f for f in frames[:1]):
            continue
        if not idle and IDLE.search(frames[-1]):
            continue
        total += n
        self_t[short(frames[-1])] += n
        for f in {short(f) for f in frames}:
            incl[f] += n
    return self_t, incl, total


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw", type=Path)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--thread", default=None, help="keep stacks whose root (thread) contains this")
    p.add_argument("--idle", action="store_true", help="keep idle/waiting leaf frames")
    args = p.parse_args(argv)
    self_t, incl, total = summarize(parse(args.raw), args.thread, args.idle)
    if not total:
        print("no samples")
        return
    print(f"{total} busy samples")
    for title, counter in (("self", self_t), ("inclusive", incl)):
        print(f"\n-- {title} --")
        for frame, n in counter.most_common(args.top):
            print(f"{100 * n / total:6.1f}%  {frame}")


if __name__ == "__main__":
    main()
