"""Shard benchmark: Prefill and Decode over gRPC straight to one shard, no router.

    .venv/bin/python -m bench.shard                           # starts `python -m shard serve`
    .venv/bin/python -m bench.shard --batch-sizes 1 16 --seq-lens 128 --decode-steps 16
    .venv/bin/python -m bench.shard --attach /tmp/my-shard    # a standalone shard at PATH-0

For each (batch size, sequence length): Prefill of `batch` prompts of `seq_len` tokens, then
`--decode-steps` Decode calls on that batch. Each call is timed by the client (grpc.aio, as the
router calls it) and by the shard itself (total_ns / forward_ns / decode_ns in the answer), so
the gap is the cost of the RPC: serialization, the unix socket, the servicer's thread hop.
Serve-level router overhead = client ITL (bench/serve.py) - these shard step times.

Default model: the real SmolLM2-135M-Instruct (the launcher's default model); --random-weights
runs the random-weight model of the same shape (bench/build_smollm_shape.py).

Attach only to a shard no router uses: Warmup here resizes its KV cache and drops its batches.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.models import add_model_args, resolve_model
from bench.results_file import write_results
from bench.servers import free_port
from bench.shard_batches import cache_tokens_needed, make_batch, warmup_request
from launcher.process import TERM_WITH_PARENT
from switchyard_pb import generate_pb2 as pb
from switchyard_pb import generate_pb2_grpc as pb_grpc

CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--attach", default=None, metavar="UDS_PATH", help="use a running shard")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    p.add_argument("--seq-lens", type=int, nargs="+", default=[128, 512])
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1, help="prefill+decode rounds per case")
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    return p.parse_args(argv)


def ms(ns_or_s: float, unit: str = "ns") -> float:
    return ns_or_s / 1e6 if unit == "ns" else ns_or_s * 1e3


class ShardProcess:
    """`python -m shard serve` as a rank-0-of-1 child in its own process group."""

    def __init__(self, model_dir: Path, dtype: str, log_path: Path) -> None:
        self.uds = str(Path(tempfile.gettempdir()) / f"sy-bench-{secrets.token_hex(4)}-shard")
        env = {
            **os.environ,
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
        argv = [
            sys.executable,
            "-m",
            "shard",
            "serve",
            "--model-id",
            str(model_dir),
            "--uds-path",
            self.uds,
            "--dtype",
            dtype,
        ]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            # its own group, and SIGTERM when this process dies however it dies (a caller's
            # timeout kills it outright): no orphaned shard holding memory and a socket
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=TERM_WITH_PARENT,
            )
        print(f"shard pid {self.proc.pid}, socket {self.uds}-0, log {log_path}", flush=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


async def connect(
    uds: str, proc: ShardProcess | None, timeout_s: float = 600
) -> pb_grpc.TextGenerationServiceStub:
    channel = grpc.aio.insecure_channel(f"unix://{uds}-0", options=CHANNEL_OPTIONS)
    stub = pb_grpc.TextGenerationServiceStub(channel)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.proc.poll() is not None:
            raise RuntimeError(f"shard exited with {proc.proc.returncode}; see its log")
        try:
            await stub.Health(pb.HealthRequest(), timeout=5)
            return stub
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def timed(call, request) -> tuple[Any, float]:
    t0 = time.perf_counter()
    answer = await call(request)
    return answer, time.perf_counter() - t0


async def run_case(
    stub, info, batch: int, seq_len: int, steps: int, repeats: int
) -> dict[str, Any]:
    prefill, decode = [], []
    for r in range(repeats):
        b = make_batch(
            1000 + r, batch, seq_len, steps + 1, info.block_size, info.vocab_size, seed=r
        )
        ans, rpc_s = await timed(stub.Prefill, pb.PrefillRequest(batch=b))
        prefill.append(
            {
                "rpc_ms": ms(rpc_s, "s"),
                "total_ms": ms(ans.total_ns),
                "forward_ms": ms(ans.forward_ns),
            }
        )
        cached = ans.batch
        for _ in range(steps):
            ans, rpc_s = await timed(stub.Decode, pb.DecodeRequest(batches=[cached]))
            cached = ans.batch
            decode.append(
                {
                    "rpc_ms": ms(rpc_s, "s"),
                    "total_ms": ms(ans.total_ns),
                    "forward_ms": ms(ans.forward_ns),
                    "sample_ms": ms(ans.decode_ns),
                    "concat_ms": ms(ans.concat_ns),
                }
            )
        await stub.ClearCache(pb.ClearCacheRequest(id=cached.id))

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    out: dict[str, Any] = {"batch": batch, "seq_len": seq_len}
    for key in ("rpc_ms", "total_ms", "forward_ms"):
        out[f"prefill_{key}"] = med(prefill, key)
    for key in ("rpc_ms", "total_ms", "forward_ms", "sample_ms", "concat_ms"):
        out[f"decode_{key}"] = med(decode, key)
    out["prefill_tok_s"] = batch * seq_len / (out["prefill_rpc_ms"] / 1e3)
    out["decode_tok_s"] = batch / (out["decode_rpc_ms"] / 1e3)
    out["decode_rpc_overhead_ms"] = out["decode_rpc_ms"] - out["decode_total_ms"]
    return out


def table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("B", "batch", "{}"),
        ("S", "seq_len", "{}"),
        ("prefill rpc ms", "prefill_rpc_ms", "{:.1f}"),
        ("prefill shard ms", "prefill_total_ms", "{:.1f}"),
        ("prefill tok/s", "prefill_tok_s", "{:.0f}"),
        ("decode rpc ms", "decode_rpc_ms", "{:.2f}"),
        ("decode shard ms", "decode_total_ms", "{:.2f}"),
        ("forward ms", "decode_forward_ms", "{:.2f}"),
        ("sample+out ms", "decode_sample_ms", "{:.2f}"),
        ("rpc-shard ms", "decode_rpc_overhead_ms", "{:.2f}"),
        ("decode tok/s", "decode_tok_s", "{:.1f}"),
    ]
    body = [[fmt.format(r[key]) for _, key, fmt in cols] for r in rows]
    header = [name for name, _, _ in cols]
    widths = [max(len(c) for c in col) for col in zip(header, *body, strict=True)]
    line = "  ".join("{:>" + str(w) + "}" for w in widths)
    return "\n".join(line.format(*r) for r in [header, *body])


async def bench(args: argparse.Namespace, proc: ShardProcess | None) -> dict[str, Any]:
    uds = args.attach or proc.uds
    t0 = time.monotonic()
    stub = await connect(uds, proc)
    print(f"shard healthy after {time.monotonic() - t0:.1f} s", flush=True)
    info = await stub.Info(pb.InfoRequest())
    need = max(
        cache_tokens_needed(b, s, args.decode_steps + 1, info.block_size)
        for b in args.batch_sizes
        for s in args.seq_lens
    )
    await stub.Warmup(warmup_request(info.block_size, info.vocab_size, need))
    rows = []
    for s in args.seq_lens:
        for b in args.batch_sizes:
            row = await run_case(stub, info, b, s, args.decode_steps, args.repeats)
            rows.append(row)
            print(
                f"  B={b} S={s}: prefill {row['prefill_rpc_ms']:.1f} ms, "
                f"decode {row['decode_rpc_ms']:.2f} ms/step (shard {row['decode_total_ms']:.2f})",
                flush=True,
            )
    info_d = {
        "dtype": info.dtype,
        "device": info.device_type,
        "attention": info.attention_impl,
        "block_size": info.block_size,
        "model_id": info.model_id,
    }
    return {"info": info_d, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    proc = None
    model_label = "attached shard"
    if not args.attach:
        model_dir, model_label = resolve_model(args)
        print(f"model: {model_label} ({model_dir})", flush=True)
        proc = ShardProcess(model_dir, args.dtype, args.out / "logs" / "shard.log")
    try:
        result = asyncio.run(bench(args, proc))
    finally:
        if proc is not None:
            proc.stop()
    result["meta"] = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average": os.getloadavg(),
        "model": model_label,
        "decode_steps": args.decode_steps,
        "repeats": args.repeats,
    }
    print()
    print(table(result["rows"]))
    b16 = [r for r in result["rows"] if r["batch"] == 16]
    for r in b16:
        print(
            f"batch 16, S={r['seq_len']}: shard step {r['decode_total_ms']:.2f} ms, client RPC "
            f"{r['decode_rpc_ms']:.2f} ms (+{r['decode_rpc_overhead_ms']:.2f} ms, "
            f"{100 * r['decode_rpc_overhead_ms'] / r['decode_total_ms']:.1f}%)"
        )
    path = write_results(args.out, "shard", result)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
