"""Divergence check: every shard must answer a step with the same batch and the same tokens.

Shards compute in lock-step and agree on each sampled token (rank 0 broadcasts it), so their
answers to Prefill and Decode must match. A mismatch means their states have split (a missed
RPC, a different cached batch, a broken collective); the step then fails with this error, its
requests get a 424, and the router clears the shards' caches instead of streaming tokens that
only one rank believes in.
"""

from __future__ import annotations

from collections.abc import Sequence

from switchyard_pb import generate_pb2 as pb

StepResponse = pb.PrefillResponse | pb.DecodeResponse


class ShardDivergenceError(RuntimeError):
    def __init__(self, method: str, detail: str) -> None:
        super().__init__(f"{method}: {detail}")
        # What the client is told; the detail (request and token ids) goes to the log.
        self.summary = f"the shards' answers to {method} diverged"


def _tokens(answer: StepResponse) -> list[tuple[int, tuple[int, ...]]]:
    return [(g.request_id, tuple(g.tokens.ids)) for g in answer.generations]


def _cached(answer: StepResponse) -> tuple[int, tuple[int, ...]] | None:
    return (answer.batch.id, tuple(answer.batch.request_ids)) if answer.HasField("batch") else None


def _adapter_failures(answer: StepResponse) -> list[tuple[str, tuple[int, ...]]]:
    failures = getattr(answer, "adapter_failures", ())  # Prefill only
    return [(f.adapter_id, tuple(f.request_ids)) for f in failures]


def check_agreement(method: str, answers: Sequence[StepResponse]) -> None:
    """Raises ShardDivergenceError naming the first request (or batch) where a shard differs
    from shard 0. A few microseconds per request: it runs on every step."""
    want_tokens, want_cached = _tokens(answers[0]), _cached(answers[0])
    want_failures = _adapter_failures(answers[0])
    for rank, answer in enumerate(answers[1:], start=1):
        failures = _adapter_failures(answer)
        if failures != want_failures:
            raise ShardDivergenceError(
                method,
                f"shard {rank} failed adapter requests {failures} but shard 0 failed "
                f"{want_failures} (adapter, request ids)",
            )
        tokens = _tokens(answer)
        if tokens != want_tokens:
            raise ShardDivergenceError(method, _first_difference(tokens, want_tokens, rank))
        cached = _cached(answer)
        if cached != want_cached:
            raise ShardDivergenceError(
                method,
                f"shard {rank} holds cached batch {cached} but shard 0 holds "
                f"{want_cached} (batch id, request ids); the shards' states diverged",
            )


def _first_difference(
    got: list[tuple[int, tuple[int, ...]]], want: list[tuple[int, tuple[int, ...]]], rank: int
) -> str:
    for (rid, ids), (want_rid, want_ids) in zip(got, want, strict=False):
        if rid != want_rid:
            return f"shard {rank} answered request {rid} where shard 0 answered {want_rid}"
        if ids != want_ids:
            return (
                f"shards disagree on the token sampled for request {rid}: shard 0 has "
                f"{list(want_ids)}, shard {rank} has {list(ids)}"
            )
    return f"shard {rank} answered {len(got)} request(s) but shard 0 answered {len(want)}"
