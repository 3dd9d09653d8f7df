"""Probes a shard the way the router will talk to it: a gRPC Health call over its unix socket."""

from __future__ import annotations

import os
from pathlib import Path


def shard_is_healthy(socket_path: Path, timeout_s: float = 2.0) -> bool:
    """True once the shard answers Health, which it does only when its model can run."""
    if not socket_path.exists():
        return False
    # The launcher forks children (the router after these probes) and each child execs at
    # once, so grpc's fork handlers have nothing to protect; run in a child between fork and
    # exec, they have aborted it (ev_epoll1 "wakeup_fd_->Wakeup().ok()"). Off before grpc loads.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    import grpc

    from switchyard_pb import generate_pb2, generate_pb2_grpc

    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub = generate_pb2_grpc.TextGenerationServiceStub(channel)
        try:
            stub.Health(generate_pb2.HealthRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return True
