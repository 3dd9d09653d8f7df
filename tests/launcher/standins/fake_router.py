"""Stand-in for `python -m router`: accepts the router's command line, records it, and waits for
SIGTERM (or exits on its own when FAKE_ROUTER_EXIT_AFTER_S is set)."""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--shard-uds-path", required=True)
    parser.add_argument("--hostname", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--served-model-name")
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
    if not Path(f"{args.shard_uds_path}-0").exists():
        sys.exit("router started before shard 0's socket existed")
    pid_dir = os.environ.get("FAKE_PID_DIR")
    if pid_dir:
        info = {"pid": os.getpid(), "argv": sys.argv[1:]}
        Path(pid_dir, "router.json").write_text(json.dumps(info))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
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
