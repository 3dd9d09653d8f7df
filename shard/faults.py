"""Faults injected on purpose, for the tests that show what the server does when a step goes
wrong (integration-tests/test_faults.py): read once from the environment, off unless set.

- SWITCHYARD_FAULT_FAIL_FORWARD=N: the Nth forward pass served (Warmup's not counted) raises
  inside the model, as a device error or an out-of-memory would.
- SWITCHYARD_FAULT_HANG_FORWARD=N: the Nth forward pass never returns, as a deadlocked kernel
  or collective.
- SWITCHYARD_FAULT_REFUSE_STEP=N: the Nth step is refused before it touches the model, as a
  request the shard cannot serve is.
- SWITCHYARD_FAULT_RANKS=0,1: the ranks they apply to (default: every rank).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass


class InjectedFault(RuntimeError):
    """A forward pass failed on purpose."""


@dataclass
class Faults:
    fail_forward: int = 0  # 0: never
    hang_forward: int = 0
    refuse_step: int = 0
    forwards: int = 0
    steps: int = 0

    @classmethod
    def from_env(cls, rank: int, environ: Mapping[str, str] = os.environ) -> Faults | None:
        ranks = environ.get("SWITCHYARD_FAULT_RANKS", "").strip()
        if ranks and str(rank) not in {r.strip() for r in ranks.split(",")}:
            return None
        faults = cls(
            fail_forward=int(environ.get("SWITCHYARD_FAULT_FAIL_FORWARD", "0") or 0),
            hang_forward=int(environ.get("SWITCHYARD_FAULT_HANG_FORWARD", "0") or 0),
            refuse_step=int(environ.get("SWITCHYARD_FAULT_REFUSE_STEP", "0") or 0),
        )
        return faults if faults.fail_forward or faults.hang_forward or faults.refuse_step else None

    def before_step(self) -> None:
        self.steps += 1
        if self.steps == self.refuse_step:
            raise ValueError(f"step {self.steps} refused (SWITCHYARD_FAULT_REFUSE_STEP)")

    def before_forward(self) -> None:
        self.forwards += 1
        if self.forwards == self.fail_forward:
            raise InjectedFault(f"forward {self.forwards} failed (SWITCHYARD_FAULT_FAIL_FORWARD)")
        if self.forwards == self.hang_forward:
            threading.Event().wait()  # never set: the step never returns
