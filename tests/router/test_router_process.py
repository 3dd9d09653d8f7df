"""`python -m router` as a real process against in-process fake shards: refusal and serving."""

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

from router.__main__ import main as router_main
from tests.router.fake_shard import start_fake_shards
from tests.router.harness import async_test

REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _router(model_dir: Path, uds: str, *flags: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "router",
        "--model-id",
        str(model_dir),
        "--shard-uds-path",
        uds,
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=REPO_ROOT,
    )


def _http(method: str, url: str, payload: dict | None = None) -> tuple[int, str]:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


def test_router_refuses_limits_the_cache_cannot_hold(model_dir, capsys):
    """main() exits non-zero with one line naming the flag (shards served from a thread)."""
    sock_dir = tempfile.mkdtemp(prefix="sy-")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    _, servers = asyncio.run_coroutine_threadsafe(
        start_fake_shards(f"{sock_dir}/s", 1, num_blocks=10), loop
    ).result(10)
    try:
        argv = [
            "--model-id",
            str(model_dir),
            "--shard-uds-path",
            f"{sock_dir}/s",
            "--max-total-tokens",
            "200",
        ]
        assert router_main(argv) != 0
        err = capsys.readouterr().err
        assert "--max-total-tokens (200)" in err and "Traceback" not in err
    finally:
        for server in servers:
            asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        shutil.rmtree(sock_dir, ignore_errors=True)


@async_test
async def test_router_serves_and_stops_on_sigterm(model_dir):
    sock_dir = tempfile.mkdtemp(prefix="sy-")
    shards, servers = await start_fake_shards(f"{sock_dir}/s", 2)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = await _router(model_dir, f"{sock_dir}/s", "--hostname", "127.0.0.1", "--port", str(port))
    try:
        for _ in range(300):
            status, _ = await asyncio.to_thread(_http, "GET", f"{base}/health")
            if status == 200 or proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        assert status == 200
        status, body = await asyncio.to_thread(
            _http, "POST", f"{base}/generate", {"inputs": "H", "parameters": {"max_new_tokens": 3}}
        )
        assert (status, json.loads(body)) == (200, {"generated_text": "IJK"})
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 10)
        assert proc.returncode == 0
        assert [v for s in shards for v in s.violations] == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for server in servers:
            await server.stop(None)
        shutil.rmtree(sock_dir, ignore_errors=True)
