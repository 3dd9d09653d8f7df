"""Starting, probing and stopping the servers under test, one at a time on the same machine.

Each server runs in its own session (process group), so stopping it reaches every child
(the launcher's shards and router, uvicorn's workers) and nothing else.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.process import TERM_WITH_PARENT

BIN = Path(sys.executable).parent  # the venv's console scripts sit next to its python
STOP_GRACE_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ManagedServer:
    name: str
    argv: list[str]
    port: int
    model: str  # the OpenAI "model" field this server expects
    extra_body: dict[str, Any]  # per-request fields for its OpenAI API
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{self.name}.log"
        log = open(self.log_path, "w")
        print(f"[{self.name}] starting: {' '.join(self.argv)}", flush=True)
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,
            preexec_fn=TERM_WITH_PARENT,  # SIGTERM when the benchmark dies, however it dies
        )
        log.close()

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until GET /health answers 200; raises with the log's tail if it never does."""
        assert self.proc is not None
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready after {timeout_s:.0f} s\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after a grace period."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
        try:  # children that outlived their leader still belong to the group
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def switchyard(model_dir: Path, extra_args: list[str], *, ignore_eos: bool = True) -> ManagedServer:
    port = free_port()
    # Private socket path and rendezvous port: other Switchyards may be running on this machine.
    sockets = Path(tempfile.gettempdir()) / f"sy-bench-{secrets.token_hex(4)}-shard"
    # The installed console script, else the same entry point through this python (a GPU
    # machine runs the checkout without installing it).
    script = BIN / "launcher"
    launcher = [str(script)] if script.exists() else [
        sys.executable, "-c", "import sys; from launcher.main import main; sys.exit(main())"
    ]  # fmt: skip
    argv = [
        *launcher,
        "--model-id", str(model_dir),
        "--dtype", "bfloat16",
        "--hostname", "127.0.0.1",
        "--port", str(port),
        "--shard-uds-path", str(sockets),
        "--master-port", str(free_port()),
        *extra_args,
    ]  # fmt: skip
    return ManagedServer(
        name="switchyard",
        argv=argv,
        port=port,
        model=str(model_dir),
        # Greedy, like the transformers side; ignore_eos gives every request max_tokens tokens.
        extra_body={"ignore_eos": ignore_eos, "temperature": 0.0},
    )


def transformers_kv_blocks(model_dir: Path, page_size: int = 256) -> int:
    """transformers' --cb-num-blocks for the KV memory a Switchyard CPU shard takes by default.

    Left alone, transformers' continuous batching takes 60% of free RAM on CPU for its cache and
    zero-fills it on the first request (12 GiB and ~60 s on a 23 GiB machine, paid in the
    warm-up). That is its default, and the default comparison runs it so; this size is only for
    the labelled equal-KV configuration. A block is `page_size` tokens, all layers.
    """
    from shard.platforms.host_memory import (
        CPU_DEFAULT_CAP_BYTES,
        CPU_DEFAULT_SHARE,
        available_host_memory,
    )

    cfg = json.loads((model_dir / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    kv_heads = cfg.get("num_key_value_heads") or heads
    bytes_per_token = 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * 2  # K and V, bf16
    budget = min(available_host_memory() * CPU_DEFAULT_SHARE, CPU_DEFAULT_CAP_BYTES)
    return max(1, int(budget // (page_size * bytes_per_token)))


def transformers_serve(
    model_dir: Path, extra_args: list[str], *, ignore_eos: bool = True, equal_kv: bool = False
) -> ManagedServer:
    """`transformers serve --continuous-batching` at its own defaults (a peer runs as its users
    run it), or with `equal_kv` given the KV memory a Switchyard CPU shard takes, as a second,
    labelled configuration ("transformers-equal-kv")."""
    port = free_port()
    user_kv = any(a.startswith(("--cb-num-blocks", "--cb-max-memory-percent")) for a in extra_args)
    if equal_kv and not user_kv:
        extra_args = ["--cb-num-blocks", str(transformers_kv_blocks(model_dir)), *extra_args]
    argv = [
        str(BIN / "transformers"),
        "serve",
        str(model_dir),  # FORCE_MODEL: preloaded at startup, every request must name it
        "--continuous-batching",
        "--device", _peer_device(),
        "--dtype", "bfloat16",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--log-level", "warning",
        *extra_args,
    ]  # fmt: skip
    # transformers serve rejects unknown fields such as ignore_eos (422). Its continuous
    # batching takes eos_token_id per request from the generation config, and -1 disables it;
    # do_sample false = greedy. A body `generation_config` replaces the model's, so both are set
    # (the model's own EOS when requests are to end there).
    eos = -1 if ignore_eos else _model_eos(model_dir)
    generation_config = {"eos_token_id": eos, "do_sample": False}
    return ManagedServer(
        name="transformers-equal-kv" if equal_kv else "transformers",
        argv=argv,
        port=port,
        model=str(model_dir),
        extra_body={"generation_config": json.dumps(generation_config)},
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )


def _peer_device() -> str:
    """The device the Switchyard under test takes by default, so both serve on the same one:
    the GPU where there is one (transformers' own "auto" would pick it too), else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _model_eos(model_dir: Path) -> int | list[int]:
    """The EOS that ends generation, as transformers reads it: generation_config.json first."""
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.exists() and (eos := json.loads(path.read_text()).get("eos_token_id")) is not None:
            return eos
    raise ValueError(f"{model_dir} names no eos_token_id")


FACTORIES = {
    "switchyard": switchyard,
    "transformers": transformers_serve,
    "transformers-equal-kv": functools.partial(transformers_serve, equal_kv=True),
}
