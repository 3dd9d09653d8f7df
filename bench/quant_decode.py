"""Int4 (AWQ GEMM) vs bfloat16 decode on the CPU: tokens/s and peak RSS per shard, side by side.

    /tmp/qtools/bin/python bench/build_quantized.py          # once: the models (AutoAWQ's venv)
    .venv/bin/python -m bench.quant_decode                    # smollm and llama1b, batch 1 and 16
    .venv/bin/python -m bench.quant_decode --shapes smollm --rounds 3 --steps 64
    .venv/bin/python -m bench.quant_decode --pair NAME BF16_DIR AWQ_DIR   # any pair of checkpoints

For each pair, two shards (`python -m shard serve`, one process each, as bench/shard.py starts
them) are loaded one after the other and both kept alive: the bf16 model with `--dtype
bfloat16`, the AWQ model with `--dtype auto` (bf16 on CPU for int4, so torch's int4 kernel
runs). Then `--rounds` rounds, each: for every batch size, on each shard in turn (the order
flips every round so neither model always runs first), a Prefill of `batch` prompts of
`--prompt-len` random ids and `--steps` Decode calls, the median client-observed step giving
tok/s = batch / step (bench/shard.py's `run_case`). An idle shard computes nothing, so the two
never compete for the cores. Peak RSS is each shard's VmHWM from /proc: after load, after
Warmup (KV cache allocated), and at the end (prefill and decode peaks included).

Prints a table per pair with AWQ/bf16 ratios and writes quant-decode-<time>.json and .md
under --out (bench/results/ is git-ignored: docs/benchmarks.md carries the numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.build_quantized import GROUP_SIZE, default_root, model_dirs
from bench.load_memory import read_status
from bench.quant_decode_report import markdown, summarize
from bench.shard import ShardProcess, connect, run_case
from bench.shard_batches import cache_tokens_needed, warmup_request
from switchyard_pb import generate_pb2 as pb

KINDS = ("bf16", "awq")
# bf16 is asked for by name; the AWQ shard picks its dtype the way a user's would (auto).
DTYPE_ARG = {"bf16": "bfloat16", "awq": "auto"}


@dataclass
class Pair:
    name: str
    dirs: dict[str, Path]  # kind -> model directory


@dataclass
class Shard:
    kind: str
    proc: ShardProcess
    stub: Any
    info: Any
    ready_s: float
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # stage -> /proc fields

    def snapshot(self, stage: str) -> None:
        self.memory[stage] = read_status(self.proc.proc.pid)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", choices=sorted(GROUP_SIZE), default=["smollm", "llama1b"])
    p.add_argument("--model-root", type=Path, default=None, help=f"default: {default_root()}")
    p.add_argument(
        "--pair",
        nargs=3,
        action="append",
        metavar=("NAME", "BF16_DIR", "AWQ_DIR"),
        help="measure this pair instead of --shapes (repeatable)",
    )
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=32, help="decode steps per case (median taken)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds per pair")
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    return p.parse_args(argv)


def pairs_of(args: argparse.Namespace) -> list[Pair]:
    if args.pair:
        return [Pair(n, {"bf16": Path(b), "awq": Path(a)}) for n, b, a in args.pair]
    root = args.model_root or default_root()
    pairs = []
    for shape in args.shapes:
        bf16, awq = model_dirs(root, shape)
        if not (bf16 / "config.json").is_file() or not (awq / "config.json").is_file():
            raise SystemExit(
                f"{shape}: no models under {root}; build them with\n"
                f"  /tmp/qtools/bin/python bench/build_quantized.py --shapes {shape}"
                + (f" --out {root}" if args.model_root else "")
            )
        pairs.append(Pair(shape, {"bf16": bf16, "awq": awq}))
    return pairs


async def start_shard(kind: str, model_dir: Path, need_tokens: int, log: Path) -> Shard:
    proc = ShardProcess(model_dir.resolve(), DTYPE_ARG[kind], log)
    t0 = time.monotonic()
    try:
        stub = await connect(proc.uds, proc)
        shard = Shard(kind, proc, stub, await stub.Info(pb.InfoRequest()), time.monotonic() - t0)
        shard.snapshot("loaded")
        info = shard.info
        await stub.Warmup(warmup_request(info.block_size, info.vocab_size, need_tokens))
        shard.snapshot("warm")
    except BaseException:
        proc.stop()
        raise
    return shard


async def bench_pair(pair: Pair, args: argparse.Namespace) -> dict[str, Any]:
    need = cache_tokens_needed(max(args.batch_sizes), args.prompt_len, args.steps + 1, 16)
    shards: dict[str, Shard] = {}
    cases = []
    try:
        for kind in KINDS:
            log = args.out / "logs" / f"quant-decode-{pair.name}-{kind}.log"
            shards[kind] = await start_shard(kind, pair.dirs[kind], need, log)
            if shards[kind].info.block_size != 16:
                raise RuntimeError("the KV budget above assumes the shard's default block size")
        for r in range(args.rounds):
            order = KINDS if r % 2 == 0 else KINDS[::-1]
            for batch in args.batch_sizes:
                for kind in order:
                    s = shards[kind]
                    row = await run_case(s.stub, s.info, batch, args.prompt_len, args.steps, 1)
                    cases.append({"pair": pair.name, "model": kind, "round": r, **row})
                    print(
                        f"  {pair.name} round {r} B={batch} {kind}: "
                        f"{row['decode_rpc_ms']:.2f} ms/step, {row['decode_tok_s']:.1f} tok/s",
                        flush=True,
                    )
        for s in shards.values():
            s.snapshot("end")
    finally:
        for s in shards.values():
            s.proc.stop()
    return {
        "pair": pair.name,
        "shards": {
            kind: {
                "model_dir": str(pair.dirs[kind]),
                "checkpoint_bytes": sum(
                    f.stat().st_size for f in pair.dirs[kind].glob("*.safetensors")
                ),
                "dtype": s.info.dtype,
                "command": shlex.join(map(str, s.proc.proc.args)),
                "ready_s": s.ready_s,
                "memory": s.memory,
            }
            for kind, s in shards.items()
        },
        "cases": cases,
    }


def environment(argv: list[str]) -> dict[str, Any]:
    import torch

    cpu, flags = platform.processor(), []
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
            flags = [f for f in line.split(":", 1)[1].split() if f in wanted]
            break

    def git(*cmd: str) -> str:
        done = subprocess.run(["git", *cmd], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join([sys.executable, "-m", "bench.quant_decode", *argv]),
        "cpu": f"{cpu}, {os.cpu_count()} logical CPUs, flags {' '.join(flags)}",
        "torch_threads_per_shard": torch.get_num_threads(),  # the shard's default (1 rank)
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "load_average_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "versions": {p: metadata.version(p) for p in ("torch", "transformers", "grpcio")},
        "git": {"head": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "-s"))},
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    result: dict[str, Any] = {
        "environment": environment(argv),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    result["pairs"] = [asyncio.run(bench_pair(pair, args)) for pair in pairs_of(args)]
    result["environment"]["load_average_at_end"] = os.getloadavg()
    result["summary"] = summarize(result["pairs"])
    text = markdown(result)
    print()
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"quant-decode-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2))
    stem.with_suffix(".md").write_text(text + "\n")
    print(f"results: {stem}.json, {stem}.md")


if __name__ == "__main__":
    main()
