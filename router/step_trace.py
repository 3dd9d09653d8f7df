"""A timeline of the scheduler's steps, kept in memory for `GET /debug/steps`: where a step's
wall time goes (the shards' forward and sampling, the gRPC round trip around them, the router's
own handling of the answer) and how long the scheduler sat idle between steps.

One record per Prefill/Decode RPC, in a ring of the last `capacity` steps, so a benchmark can
fetch the window it ran in (from `since`, a step number) without the router holding on to an
unbounded history. Times are monotonic seconds, the same clock as the records' `start`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class StepRecord:
    step: int  # running number, from 0 at startup
    kind: str  # "prefill" (new requests join) or "decode" (the running batch only)
    start: float  # when the RPC was sent
    prefill_tokens: int  # prompt tokens computed in this step
    decode_rows: int  # rows that were decoding (one token each)
    new_requests: int  # requests that joined in this step
    idle_before_s: float  # since the previous step's handling ended, with nothing to do
    rpc_s: float = 0.0  # send to answer: the shards' step plus transport
    shard_s: float = 0.0  # the step as the shards timed it (rank 0)
    forward_s: float = 0.0
    sample_s: float = 0.0
    router_s: float = 0.0  # answer to the end of its handling: tokens, stops, streaming, filter
    # Speculative decoding: tokens proposed for the decoding rows (each computed beside the
    # row's own token), and how many of them the shards' samples agreed with.
    proposed_tokens: int = 0
    accepted_tokens: int = 0


class StepTrace:
    def __init__(self, capacity: int = 4096) -> None:
        self.records: deque[StepRecord] = deque(maxlen=capacity)
        self._count = 0
        self._open: StepRecord | None = None
        self._last_end: float | None = None

    def begin(
        self,
        kind: str,
        prefill_tokens: int,
        decode_rows: int,
        new_requests: int,
        proposed_tokens: int = 0,
    ) -> None:
        now = time.monotonic()
        self._finish(now)
        idle = 0.0 if self._last_end is None else now - self._last_end
        self._open = StepRecord(
            self._count,
            kind,
            now,
            prefill_tokens,
            decode_rows,
            new_requests,
            idle,
            proposed_tokens=proposed_tokens,
        )
        self._count += 1

    def answered(self, forward_ns: int, decode_ns: int, total_ns: int) -> None:
        if self._open is None:
            return
        record = self._open
        record.rpc_s = time.monotonic() - record.start
        record.shard_s, record.forward_s, record.sample_s = (
            total_ns / 1e9, forward_ns / 1e9, decode_ns / 1e9
        )  # fmt: skip

    def accepted(self, tokens: int) -> None:
        """Proposed tokens of the open step that a request's answer accepted."""
        if self._open is not None:
            self._open.accepted_tokens += tokens

    def handled(self) -> None:
        """The step's answer is fully handled: the scheduler is free for the next one."""
        self._finish(time.monotonic())

    def failed(self) -> None:
        self._open, self._last_end = None, time.monotonic()

    def _finish(self, now: float) -> None:
        if self._open is None:
            return
        record, self._open = self._open, None
        record.router_s = max(0.0, now - record.start - record.rpc_s)
        self.records.append(record)
        self._last_end = now

    def snapshot(self, since: int = 0) -> dict[str, Any]:
        """The records from step `since` on, and their totals."""
        records = [r for r in self.records if r.step >= since]
        totals = {
            key: round(sum(getattr(r, key) for r in records), 6)
            for key in ("rpc_s", "shard_s", "forward_s", "sample_s", "router_s", "idle_before_s")
        }
        return {
            "steps": [asdict(r) for r in records],
            "next": self._count,
            "totals": totals
            | {
                "steps": len(records),
                "prefill_tokens": sum(r.prefill_tokens for r in records),
                "decode_rows": sum(r.decode_rows for r in records),
                "proposed_tokens": sum(r.proposed_tokens for r in records),
                "accepted_tokens": sum(r.accepted_tokens for r in records),
            },
        }
