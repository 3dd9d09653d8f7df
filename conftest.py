"""The whole suite's settings for running it on several workers (`make test` on a machine
without a GPU: two pytest-xdist workers, `--dist loadfile` so that a module's server starts
once, on one worker).

A worker shares the machine's cores with the others: its torch gets its share of them, not
all, and so do the servers the end-to-end tests start (they inherit OMP_NUM_THREADS). In one
process (plain `pytest`) nothing here changes anything.
"""

from __future__ import annotations

import os

WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # set by xdist before it loads any conftest
if WORKER is not None:
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    _threads = str(max(1, (os.cpu_count() or 1) // _workers))
    # Before torch is imported (tests/conftest.py imports it): its OpenMP pool reads these once.
    os.environ.setdefault("OMP_NUM_THREADS", _threads)
    os.environ.setdefault("MKL_NUM_THREADS", _threads)


def pytest_collection_modifyitems(config, items):
    """On several workers, the end-to-end files (marked slow; tens of seconds to minutes each)
    go out first and the many short unit tests fill in behind them: a worker handed a long file
    last would run it alone while the others wait. xdist hands out whole files in this order
    (with --no-loadscope-reorder). In one process the unit tests stay first: they fail fast."""
    if WORKER is None:
        return
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("slow") is None)
