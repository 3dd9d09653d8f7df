"""Peak memory of each shard while it loads its tensor-parallel slice, for 1 and N ranks.

    .venv/bin/python bench/load_memory.py [--world-sizes 1 2] [--model-dir DIR]

Without --model-dir it builds (once, cached under /tmp) a random Llama of ~250 MB of float32
weights. Every rank is a fresh interpreter started the way the launcher starts shards (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT; gloo on CPU) and runs the shard's own `load_model`.
Each rank first loads a tiny model (so one-time imports and initialization are in the
baseline), then reports its RSS just before loading and its VmHWM (peak RSS) after; meanwhile
the parent samples /proc/<pid>/status to split the growth into anonymous memory (the rank's
own copies) and file-backed pages (checkpoint pages mapped by safetensors' mmap), which VmHWM
lumps together. Expectation: peak - before ~= checkpoint / N + a bounded overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Run as a script, Python puts bench/ first on sys.path, where bench/shard.py would shadow the
# shard package: the repository root takes its place.
if sys.path and Path(sys.path[0]).resolve() == REPO / "bench":
    sys.path[0] = str(REPO)
MIB = 2**20
# ~62M parameters: big enough that the weights dwarf allocator noise, small enough for a laptop.
DEFAULT_SHAPE = dict(
    vocab_size=8192,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=4,
)
STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def read_status(pid: int | str = "self") -> dict[str, int]:
    """The memory lines of /proc/<pid>/status, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in STATUS_FIELDS:
                out[key] = int(value.split()[0]) * 1024
    return out


# -- worker (one rank) -------------------------------------------------------------------------


def worker(model_dir: str, warmup_dir: str) -> None:
    import torch

    from shard.distributed import Distributed, init_distributed
    from shard.models import load_model

    torch.set_num_threads(1)
    dist = init_distributed(torch.device("cpu"))
    # A tiny model first, alone: whatever loading imports or initializes once (transformers'
    # config classes, kernels, allocator arenas) is in the baseline, not in the weights' share.
    load_model(Path(warmup_dir), dtype=torch.float32, device=dist.device, dist=Distributed())
    before = read_status()
    start = time.perf_counter()
    model = load_model(Path(model_dir), dtype=torch.float32, device=dist.device, dist=dist)
    seconds = time.perf_counter() - start
    peak = read_status()
    # Tied parameters are one tensor: count each once (packed ones have no data_ptr: their own).
    unique = {
        (id(p) if p.is_mkldnn else p.data_ptr()): p.numel() * p.element_size()
        for p in model.parameters()
    }
    report = {
        "rank": dist.rank,
        "world_size": dist.world_size,
        "param_bytes": sum(unique.values()),
        "rss_before": before["VmRSS"],
        "anon_before": before["RssAnon"],
        "file_before": before["RssFile"],
        "hwm_before": before["VmHWM"],
        "hwm_after": peak["VmHWM"],
        "rss_after": peak["VmRSS"],
        "file_after": peak["RssFile"],
        "load_s": seconds,
    }
    print("REPORT " + json.dumps(report), flush=True)
    if dist.world_size > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


# -- parent ------------------------------------------------------------------------------------


@dataclass
class RankResult:
    report: dict
    peak_anon: int  # sampled by the parent
    peak_file: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cached_model(root: Path, **shape: int) -> Path:
    from launcher.tiny_models import build_model

    path = root / ("switchyard-bench-llama-" + "-".join(f"{v}" for v in shape.values()))
    if not (path / "config.json").exists():
        print(f"building {path} ...", file=sys.stderr)
        build_model(path, "LlamaForCausalLM", **shape)
    return path


def run_world(model_dir: Path, warmup_dir: Path, world: int, sample_s: float) -> list[RankResult]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": str(REPO),
            "CUDA_VISIBLE_DEVICES": "",  # the measurement is about host memory
        }
        argv = [sys.executable, __file__, "--worker", str(model_dir), str(warmup_dir)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    peak_anon = [0] * world
    peak_file = [0] * world
    while any(p.poll() is None for p in procs):
        for r, p in enumerate(procs):
            try:
                st = read_status(p.pid)
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue
            peak_anon[r] = max(peak_anon[r], st.get("RssAnon", 0))
            peak_file[r] = max(peak_file[r], st.get("RssFile", 0))
        time.sleep(sample_s)
    results = []
    for r, p in enumerate(procs):
        out = p.stdout.read() if p.stdout else ""
        if p.returncode != 0:
            raise RuntimeError(f"rank {r} of {world} exited with {p.returncode}")
        line = next(x for x in out.splitlines() if x.startswith("REPORT "))
        results.append(RankResult(json.loads(line[len("REPORT ") :]), peak_anon[r], peak_file[r]))
    return results


def checkpoint_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    p.add_argument(
        "--layers", type=int, default=DEFAULT_SHAPE["num_hidden_layers"], help="default model's"
    )
    p.add_argument("--cache", type=Path, default=Path("/tmp"), help="where the default model goes")
    p.add_argument("--sample-ms", type=float, default=2.0, help="parent's /proc sampling period")
    p.add_argument("--json", action="store_true", help="print raw per-rank reports too")
    p.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        worker(*args.worker)
        return
    shape = {**DEFAULT_SHAPE, "num_hidden_layers": args.layers}
    model_dir = args.model_dir or cached_model(args.cache, **shape)
    warmup_dir = cached_model(args.cache, vocab_size=512, hidden_size=64, intermediate_size=128)
    ckpt = checkpoint_bytes(model_dir)
    print(f"model {model_dir}: checkpoint {ckpt / MIB:.1f} MiB (safetensors, float32)")
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}")
    print(
        "\n| N | rank | weights on rank | RSS before | peak RSS | peak - before | / checkpoint "
        "| overhead | anon peak + | file peak + | load s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for world in args.world_sizes:
        for res in run_world(model_dir, warmup_dir, world, args.sample_ms / 1000):
            r = res.report
            grow = r["hwm_after"] - r["rss_before"]
            cells = [
                f"{world}",
                f"{r['rank']}",
                mib(r["param_bytes"]),
                mib(r["rss_before"]),
                mib(r["hwm_after"]),
                mib(grow),
                f"{grow / ckpt:.2f}",
                mib(grow - r["param_bytes"]),  # what loading needs beyond the rank's weights
                mib(res.peak_anon - r["anon_before"]),
                mib(res.peak_file - r["file_before"]),
                f"{r['load_s']:.2f}",
            ]
            print("| " + " | ".join(cells) + " |")
            if args.json:
                print(json.dumps(r))


def mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


if __name__ == "__main__":
    main()
