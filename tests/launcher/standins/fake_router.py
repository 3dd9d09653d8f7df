"""Stand-in for `python -m router`: accepts the router's command line, records it, waits for the
shards as the real router does (shard 0's socket, then every socket its ServiceDiscovery lists,
within --shard-connect-timeout), says it listens, and waits for SIGTERM (or exits on its own when
FAKE_ROUTER_EXIT_AFTER_S is set)."""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import grpc

from switchyard_pb import generate_pb2, generate_pb2_grpc


def wait_for(path: Path, deadline: float) -> None:
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"router: error: no shard is serving at {path}")
        time.sleep(0.02)


def wait_for_shards(prefix: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    first = Path(f"{prefix}-0")
    wait_for(first, deadline)
    with grpc.insecure_channel(f"unix://{first}") as channel:
        stub = generate_pb2_grpc.TextGenerationServiceStub(channel)
        urls = stub.ServiceDiscovery(generate_pb2.ServiceDiscoveryRequest(), timeout=10).urls
    for url in urls:
        wait_for(Path(url.removeprefix("unix://")), deadline)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--shard-uds-path", required=True)
    parser.add_argument("--hostname", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--served-model-name")
    parser.add_argument("--shard-connect-timeout", type=float, default=60.0)
    for flag in (
        "max-input-tokens",
        "max-total-tokens",
        "max-batch-prefill-tokens",
        "max-batch-total-tokens",
        "max-concurrent-requests",
        "max-stop-sequences",
        "max-best-of",
        "max-waiting-tokens",
    ):
        parser.add_argument(f"--{flag}", type=int)
    parser.add_argument("--waiting-served-ratio", type=float)
    parser.add_argument("--lora-adapters")
    parser.add_argument("--max-loras", type=int)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    pid_dir = os.environ.get("FAKE_PID_DIR")
    if pid_dir:
        info = {"pid": os.getpid(), "argv": sys.argv[1:]}
        Path(pid_dir, "router.json").write_text(json.dumps(info))
    wait_for_shards(args.shard_uds_path, args.shard_connect_timeout)
    print(f"router listening on {args.hostname}:{args.port}", flush=True)
    exit_after = os.environ.get("FAKE_ROUTER_EXIT_AFTER_S")
    if exit_after:
        time.sleep(float(exit_after))
        print("router: fatal error (fake)", flush=True)
        sys.exit(3)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
