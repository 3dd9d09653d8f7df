"""The host's part of a graphed decode step, measured without a device: the step's planning,
its upload, the choice and filling of a sampling head, and the answers, with every graph replay
made a no-op. On a GPU this is what the host adds to each step that cannot be queued ahead
(speculation, grammars) and what must stay under the device's part for overlap to hide it.

    python -m bench.host_step [--batches 1,16,64] [--sampling greedy,top-p] [--steps 200]

Side by side in one run: the decode fast path of shard/step_inputs.py against the general plan
(the fast path switched off), on a tiny Llama built locally, graphs replayed by the CPU's
stand-in (EagerReplayer) made no-ops. Prints the median host milliseconds per step (the best of
ROUNDS alternating rounds) and the ratio. CPU timings: relative, not a GPU host's absolute figures.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.results_file import write_results

ROUNDS = 3
SAMPLINGS = {
    "greedy": {},
    "top-p": {"do_sample": True, "temperature": 0.8, "top_p": 0.95},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--sampling", default="greedy,top-p", help=",".join(SAMPLINGS))
    p.add_argument("--steps", type=int, default=200, help="decode steps timed, each way")
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    return p.parse_args(argv)


class _NoReplay:
    def replay(self) -> None:
        """The device's part, left out."""


def build(model_dir: Path, max_batch: int):  # type: ignore[no-untyped-def]
    """The shard in process (bench.inprocess) with decode graphs and their sampling heads,
    replayed by the CPU's stand-in."""
    from bench.inprocess import build_shard
    from shard.platforms.cuda.graphs import DecodeGraphs, EagerReplayer
    from shard.sampling.graph_heads import SamplingHeads

    svc = build_shard(model_dir, "float32", overlap_schedule="off")
    runner = svc.runner
    runner.decode_path = None
    buckets = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= max(max_batch, 1))
    runner.graphs = DecodeGraphs(
        runner.model, buckets, runner.device, None, EagerReplayer(),
        heads=SamplingHeads(runner.model, runner.block_size),
    )  # fmt: skip
    return svc


def measure(svc, batch: int, sampling: dict, steps: int) -> float:  # type: ignore[no-untyped-def]
    """Median seconds of one decode step's host work, the graphs' replays made no-ops."""
    from bench.inprocess import prefilled_batch
    from bench.shard_batches import blocks_per_request

    runner, prompt, new_tokens = svc.runner, 8, steps + 5
    state = prefilled_batch(runner, batch, prompt, new_tokens, sampling)
    runner.capture_graphs(blocks_per_request(prompt, new_tokens, runner.block_size))
    graphs = runner.graphs.graphs
    for key, (_, out) in list(graphs.items()):
        graphs[key] = (_NoReplay(), out)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        runner.step(state)
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from launcher.tiny_models import build_model
    from shard import step_inputs

    batches = [int(b) for b in args.batches.split(",")]
    fast_path = step_inputs._decode_step_inputs
    rows: list[dict[str, Any]] = []
    print(f"torch {torch.__version__}; host work of a graphed decode step, replays left out")
    print("| batch | sampling | fast path (ms) | general plan (ms) | general / fast |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        svc = build(build_model(Path(tmp) / "llama"), max(batches))
        for batch in batches:
            for name in args.sampling.split(","):
                # Alternating rounds, the best median of each way: this machine's speed drifts.
                timed: dict[str, float] = {}
                for _ in range(ROUNDS):
                    for way in ("fast", "general"):
                        step_inputs._decode_step_inputs = (
                            fast_path if way == "fast" else _general_plan(step_inputs)
                        )
                        try:
                            took = measure(svc, batch, SAMPLINGS[name], args.steps)
                        finally:
                            step_inputs._decode_step_inputs = fast_path
                        timed[way] = min(took, timed.get(way, took))
                row = dict(batch=batch, sampling=name, fast_ms=timed["fast"] * 1e3,
                           general_ms=timed["general"] * 1e3)  # fmt: skip
                row["ratio"] = row["general_ms"] / row["fast_ms"]
                rows.append(row)
                print(
                    f"| {batch} | {name} | {row['fast_ms']:.3f} | {row['general_ms']:.3f} "
                    f"| {row['ratio']:.2f}x |",
                    flush=True,
                )
    path = write_results(args.out, "host_step", dict(args=vars(args), rows=rows))
    print(f"results: {path}")


def _general_plan(step_inputs):  # type: ignore[no-untyped-def]
    """The fast path's stand-in that plans the general way."""

    def general(batch, starts, device):  # type: ignore[no-untyped-def]
        q_lens = batch.history_lens - starts
        return step_inputs._step_inputs(batch, q_lens, starts, device, None)

    return general


if __name__ == "__main__":
    main()
