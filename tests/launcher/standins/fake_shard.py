"""Stand-in for `python -m shard serve`: same command line and env, a gRPC Health server on the
unix socket, and failure modes chosen through FAKE_* environment variables."""

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import grpc

from switchyard_pb import generate_pb2, generate_pb2_grpc

RANK = int(os.environ.get("RANK", "0"))


def _ranks(var: str) -> set[int]:
    return {int(r) for r in os.environ.get(var, "").split(",") if r.strip()}


class Servicer(generate_pb2_grpc.TextGenerationServiceServicer):
    def __init__(self, healthy_at: float) -> None:
        self.healthy_at = healthy_at

    async def Health(self, request, context):  # noqa: N802 (gRPC method name)
        if time.monotonic() < self.healthy_at:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model still loading")
        return generate_pb2.HealthResponse()

    async def ServiceDiscovery(self, request, context):  # noqa: N802 (gRPC method name)
        """Every rank's socket, as the real shard lists them (the stand-in router waits for
        them all before it says it listens)."""
        prefix = os.environ["FAKE_UDS_PATH"]
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return generate_pb2.ServiceDiscoveryResponse(
            urls=[f"unix://{prefix}-{r}" for r in range(world)]
        )


def record(args: argparse.Namespace) -> None:
    pid_dir = os.environ.get("FAKE_PID_DIR")
    if pid_dir:
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        info = {
            "pid": os.getpid(),
            "argv": sys.argv[1:],
            "env": {k: os.environ.get(k) for k in keys},
        }
        Path(pid_dir, f"shard-{RANK}.json").write_text(json.dumps(info))


async def serve(socket: str) -> None:
    delay = float(os.environ.get("FAKE_SHARD_UNHEALTHY_FOR_S", "0"))
    server = grpc.aio.server()
    generate_pb2_grpc.add_TextGenerationServiceServicer_to_server(
        Servicer(time.monotonic() + delay), server
    )
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    print(f"shard {RANK} serving on {socket}", flush=True)
    stop = asyncio.Event()
    if os.environ.get("FAKE_IGNORE_SIGTERM") != "1":
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    die_after = os.environ.get("FAKE_SHARD_DIE_AFTER_S")
    if die_after and RANK in _ranks("FAKE_SHARD_DIE_RANKS"):
        try:
            await asyncio.wait_for(stop.wait(), float(die_after))
        except asyncio.TimeoutError:
            print(f"shard {RANK}: fatal error in decode (fake)", flush=True)
            os._exit(3)
    await stop.wait()
    print(f"shard {RANK} stopping", flush=True)
    await server.stop(grace=0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--uds-path", required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--attention")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--cuda-memory-fraction", type=float)
    parser.add_argument("--cpu-kv-cache-gb", type=float)
    parser.add_argument("--lora-adapters")
    for flag in ("max-loras", "max-cpu-loras", "max-lora-rank"):
        parser.add_argument(f"--{flag}", type=int)
    args = parser.parse_args()
    if os.environ.get("FAKE_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record(args)
    if RANK in _ranks("FAKE_SHARD_FAIL_RANKS"):
        print("loading weights", flush=True)
        print("RuntimeError: CUDA out of memory (fake)", flush=True)
        sys.exit(7)
    if RANK in _ranks("FAKE_SHARD_HANG_RANKS"):
        for layer in range(30):
            print(f"shard {RANK} loading layer {layer}", flush=True)
        time.sleep(3600)
    os.environ["FAKE_UDS_PATH"] = args.uds_path
    asyncio.run(serve(f"{args.uds_path}-{RANK}"))


if __name__ == "__main__":
    main()
