"""The decode step of Llama-3.2-1B- and Llama-2-7B-shaped models on a GPU, with and without CUDA
graphs, against the weight-bytes roofline (every weight and each row's K/V read once per step at
the bandwidth measured here).

    python -m bench.decode_graphs [--shapes 1b,7b] [--batches 1,8,32,64] [--context 512]
                                  [--steps 32] [--sampling greedy,top-p,penalty]
                                  [--out bench/results/decode_graphs]
    python -m bench.decode_graphs --smoke     # a tiny shape on the CPU: the script runs
    python -m bench.decode_graphs --shapes 7b,7b-awq --batches 1,16   # int4 against bf16

Each model is built in process as `python -m shard serve` builds it (shard.startup), on random
bf16 weights generated on the device (no checkpoint on disk: a 7B one would take minutes to write
and read back). Each batch size prefills `batch` requests of `--context` random tokens, then
times `--steps` whole decode steps (forward, sampling, the tokens back on the host) eagerly and
replayed from the graphs (their heads sampling inside them), in one run on the same cache,
for each --sampling: greedy, top-p (temperature 0.8, top_p 0.95) or a repetition penalty.
A shape named NAME-awq is NAME as an AutoAWQ "GEMM" checkpoint (4-bit, group 128, random codes,
zero points and fp16 scales; the LM head and embeddings stay bf16), loaded through the same
reader and int4 layers a real AWQ checkpoint takes; where both NAME and NAME-awq ran, the
run ends with the ratio of their step times (issue 50: a 7B AWQ model's batch-1 decode at
>= 1.8x its bf16 model's speed). Their roofline counts every buffer the int4 layers hold (on
CUDA both tinygemm's layout and the Triton one), more than a step reads: compare their step
times with the bf16 rows rather than with the roofline.
--smoke replays with the eager stand-in for a graph (shard.platforms.cuda.graphs.EagerReplayer):
its timings mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.results_file import write_results
from bench.servers import free_port

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# --sampling: the requests' parameters, and the graph head (shard/sampling/graph_heads.py) that
# holds their steps.
SAMPLINGS: dict[str, dict[str, Any]] = {
    "greedy": {"params": {}, "head": "greedy"},
    "top-p": {"params": {"do_sample": True, "temperature": 0.8, "top_p": 0.95}, "head": "truncate"},
    "penalty": {"params": {"repetition_penalty": 1.1}, "head": "sample"},
}
# config.json of each shape (the published configs' sizes; random weights).
SHAPES: dict[str, dict[str, Any]] = {
    "1b": dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
        max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
    ),
    "7b": dict(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False,
        max_position_embeddings=4096, rope_theta=10000.0,
    ),
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False,
        max_position_embeddings=1024, rope_theta=10000.0,
    ),
}  # fmt: skip


# AutoAWQ's config entry for the -awq shapes (group 32 for the tiny one, whose K is 64).
AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "zero_point": True, "version": "gemm"}
AWQ_SUFFIX = "-awq"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1b,7b")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--context", type=int, default=512, help="prompt tokens of every request")
    p.add_argument("--steps", type=int, default=32, help="decode steps timed, each way")
    p.add_argument("--out", type=Path, default=Path("bench/results/decode_graphs"))
    p.add_argument("--smoke", action="store_true", help="tiny shape, CPU, eager stand-in")
    p.add_argument("--profile", action="store_true", help="torch.profiler at the first batch")
    p.add_argument(
        "--sampling",
        default="greedy",
        help="the requests' sampling, each a row per batch: " + ",".join(SAMPLINGS),
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.shapes = ",".join(
            "tiny" + AWQ_SUFFIX * s.endswith(AWQ_SUFFIX) for s in args.shapes.split(",")
        )
        args.batches, args.context, args.steps = "1,3", 20, 3
    return args


def hf_config(name: str) -> dict[str, Any]:
    """config.json of shape `name` (an -awq name: with AutoAWQ's quantization_config)."""
    base = name.removesuffix(AWQ_SUFFIX)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "dtype": "bfloat16",
        **SHAPES[base],
    }
    if name.endswith(AWQ_SUFFIX):
        group = 32 if base == "tiny" else 128
        config["quantization_config"] = {**AWQ_CONFIG, "group_size": group}
    return config


def checkpoint_shapes(config: dict[str, Any]) -> dict[str, list[int]]:
    """Every tensor a saved checkpoint of `config` holds, by name, from transformers' own model
    built on the meta device (no memory)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**config))
    shapes = {name: list(t.shape) for name, t in model.state_dict().items()}
    if config["tie_word_embeddings"]:
        shapes.pop("lm_head.weight", None)  # saved checkpoints drop the tied copy
    quantization = config.get("quantization_config")
    if quantization is None:
        return shapes
    group = quantization["group_size"]
    awq: dict[str, list[int]] = {}
    for name, shape in shapes.items():
        if not (name.startswith("model.layers.") and name.endswith("_proj.weight")):
            awq[name] = shape
            continue
        prefix, (n, k) = name.removesuffix(".weight"), shape
        awq[f"{prefix}.qweight"] = [k, n // 8]
        awq[f"{prefix}.qzeros"] = [k // group, n // 8]
        awq[f"{prefix}.scales"] = [k // group, n]
    return awq


class RandomSource:
    """A weights source (shard/weights.py) whose tensors are random, made on the device when
    read: small normal values, norms at one; AWQ's packed codes and zero points random int32
    words, its fp16 scales such that the weights come out about as large as the bf16 ones
    (|code - zero| is about 6.5 on average)."""

    def __init__(self, shapes: dict[str, list[int]], device) -> None:  # type: ignore[no-untyped-def]
        self.shapes, self.device = shapes, device

    def keys(self):  # type: ignore[no-untyped-def]
        return self.shapes.keys()

    def shape(self, name: str) -> list[int]:
        return self.shapes[name]

    @contextmanager
    def view(self, name: str, index: tuple) -> Iterator[Any]:
        import torch

        full = self.shapes[name]
        dims = [len(range(*s.indices(n))) for s, n in zip(index, full, strict=False)]
        dims += full[len(index) :]
        if name.endswith((".qweight", ".qzeros")):
            yield torch.randint(-(2**31), 2**31 - 1, dims, dtype=torch.int32, device=self.device)
            return
        if name.endswith(".scales"):
            yield torch.empty(dims, dtype=torch.float16, device=self.device).uniform_(2e-3, 4e-3)
            return
        out = torch.empty(dims, dtype=torch.bfloat16, device=self.device)
        yield out.fill_(1.0) if name.endswith("norm.weight") else out.normal_(0.0, 0.02)


@contextmanager
def random_weights(shapes: dict[str, list[int]], device) -> Iterator[None]:  # type: ignore[no-untyped-def]
    import shard.weights

    real = shard.weights._open_source
    shard.weights._open_source = lambda _dir: RandomSource(shapes, device)  # type: ignore[assignment]
    try:
        yield
    finally:
        shard.weights._open_source = real


def device_bandwidth(torch, device) -> float:  # type: ignore[no-untyped-def]
    """Bytes per second of a sum over 2 GiB on the device, best of 5 (a CPU: 0.25 GiB)."""
    gib = 2.0 if device.type == "cuda" else 0.25
    x = torch.ones(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device)
    best = float("inf")
    for _ in range(6):
        sync(torch, device)
        t0 = time.perf_counter()
        x.sum()
        sync(torch, device)
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 2 / best


def sync(torch, device) -> None:  # type: ignore[no-untyped-def]
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def weight_bytes(model) -> int:  # type: ignore[no-untyped-def]
    """Bytes a decode step reads of the weights: each tensor once (a tied LM head is the input
    embedding), but not an untied input embedding, of which a step reads one row per token."""
    tensors = {id(t): t for t in model.state_dict(keep_vars=True).values()}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    embed, head = model.embed_tokens.weight, model.lm_head.weight
    if embed is not head:
        total -= embed.numel() * embed.element_size()
    return total


def time_steps(torch, runner, state, steps: int) -> float:  # type: ignore[no-untyped-def]
    """Seconds per decode step, the median of `steps` after 3 untimed."""
    times = []
    for i in range(steps + 3):
        sync(torch, runner.device)
        t0 = time.perf_counter()
        runner.step(state)  # ends with the tokens on the host: a whole step
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def time_replay(torch, graphs, batch: int, head: str, repeats: int = 20) -> float:  # type: ignore[no-untyped-def]
    """Seconds of one replay of `batch`'s graph alone, back to back: what the step runs on the
    device in its graph (the forward and, where the graphs have heads, the logits and the
    sampling), without the host's work around it."""
    graph, _ = graphs.graphs[batch, False, head if graphs.heads is not None else None]
    with torch.inference_mode():  # as the runner replays (the CPU stand-in writes tensors)
        graph.replay()
        sync(torch, graphs.device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            graph.replay()
        sync(torch, graphs.device)
    return (time.perf_counter() - t0) / repeats


def profile_steps(torch, runner, state, steps: int = 10) -> None:  # type: ignore[no-untyped-def]
    """torch.profiler over graphed decode steps: where the host's time goes, op by op."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if runner.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            runner.step(state)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    print(f"profile of {steps} graphed steps, by self CPU time:\n{table}", flush=True)
    if runner.device.type == "cuda":  # the kernels inside the replayed graphs, by device time
        table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=40)
        print(f"profile of {steps} graphed steps, by device time:\n{table}", flush=True)


def measure_shape(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from bench.inprocess import build_shard
    from shard.platforms.cuda.graphs import DecodeGraphs

    batches = [int(b) for b in args.batches.split(",")]
    config = hf_config(name)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        with random_weights(checkpoint_shapes(config), device):
            graphs = () if args.smoke else tuple(batches)
            svc = build_shard(Path(tmp), "bfloat16", cuda_graphs=graphs)
    runner = svc.runner
    if args.smoke:
        from shard.platforms.cuda.graphs import EagerReplayer
        from shard.sampling.graph_heads import SamplingHeads

        runner.graphs = DecodeGraphs(
            runner.model, batches, device, replayer=EagerReplayer(),
            heads=SamplingHeads(runner.model, runner.block_size),
        )  # fmt: skip
    runner.decode_path = None  # a GPU has none; on the smoke CPU, compare the module forward
    graphs = runner.graphs
    bandwidth = device_bandwidth(torch, device)
    w_bytes = weight_bytes(runner.model)
    rows = []
    for batch in batches:
        for sampling in args.sampling.split(","):
            profile = args.profile and not rows  # the first batch's first sampling
            rows.append(
                measure_batch(torch, runner, graphs, batch, SAMPLINGS[sampling], args, profile)
            )
            rows[-1].update(shape=name, sampling=sampling)
            rows[-1]["roofline_ms"] = 1e3 * (w_bytes + rows[-1].pop("kv_bytes")) / bandwidth
            for way in ("graphs", "eager"):
                rows[-1][f"{way}_vs_roofline"] = rows[-1][f"{way}_ms"] / rows[-1]["roofline_ms"]
            print(table(rows[-1:], header=not rows[:-1]), flush=True)
    runner.free_kv_cache()
    del svc, runner, graphs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def measure_batch(  # type: ignore[no-untyped-def]
    torch, runner, graphs, batch: int, sampling: dict, args, profile: bool
) -> dict[str, Any]:
    """One batch size with one kind of sampling: eager and graphed steps, the graph alone."""
    from bench.inprocess import prefilled_batch
    from bench.shard_batches import blocks_per_request

    new_tokens = 2 * (args.steps + 3) + 10 * args.profile + 2
    runner.graphs = graphs
    state = prefilled_batch(runner, batch, args.context, new_tokens, sampling["params"])
    t0 = time.perf_counter()
    width = blocks_per_request(args.context, new_tokens, runner.block_size)
    graph_bytes = runner.capture_graphs(width)
    capture_s = time.perf_counter() - t0
    runner.graphs = None
    eager = time_steps(torch, runner, state, args.steps)
    runner.graphs = graphs
    graphed = time_steps(torch, runner, state, args.steps)
    replay = time_replay(torch, graphs, batch, sampling["head"])
    if profile:
        profile_steps(torch, runner, state)
    context = args.context + args.steps + 3  # the graphed steps' middle context, about
    return dict(
        batch=batch, context=args.context,
        eager_ms=eager * 1e3, graphs_ms=graphed * 1e3, speedup=eager / graphed,
        replay_ms=replay * 1e3, host_ms=(graphed - replay) * 1e3,
        kv_bytes=batch * context * runner.model.kv_cache_bytes_per_token(),
        tokens_per_s=batch / graphed, capture_s=capture_s, graphs_mib=graph_bytes / 2**20,
    )  # fmt: skip


COLUMNS = (
    ("shape", "{}"), ("sampling", "{}"), ("batch", "{}"), ("eager_ms", "{:.2f}"),
    ("graphs_ms", "{:.2f}"), ("speedup", "{:.2f}x"), ("replay_ms", "{:.2f}"), ("host_ms", "{:.2f}"),
    ("roofline_ms", "{:.2f}"), ("graphs_vs_roofline", "{:.2f}x"),
    ("eager_vs_roofline", "{:.2f}x"), ("tokens_per_s", "{:.0f}"), ("capture_s", "{:.1f}"),
    ("graphs_mib", "{:.0f}"),
)  # fmt: skip


def table(rows: list[dict[str, Any]], header: bool = True) -> str:
    lines = []
    if header:
        lines += ["| " + " | ".join(c for c, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(fmt.format(row[c]) for c, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def int4_ratios(rows: list[dict[str, Any]]) -> list[str]:
    """For each NAME-awq row with a NAME row of the same batch and sampling: how many times
    faster its graphed step is (> 1: int4 wins)."""
    plain = {(r["shape"], r["batch"], r["sampling"]): r for r in rows}
    lines = []
    for row in rows:
        if not row["shape"].endswith(AWQ_SUFFIX):
            continue
        base = plain.get((row["shape"].removesuffix(AWQ_SUFFIX), row["batch"], row["sampling"]))
        if base is not None:
            lines.append(
                f"{row['shape']} batch {row['batch']} {row['sampling']}: graphed step "
                f"{row['graphs_ms']:.2f} ms against {base['graphs_ms']:.2f} ms in bf16, "
                f"{base['graphs_ms'] / row['graphs_ms']:.2f}x"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    import torch

    device = "cpu (smoke: eager stand-in)" if args.smoke else torch.cuda.get_device_name()
    print(f"device: {device}; torch {torch.__version__}; context {args.context}", flush=True)
    rows: list[dict[str, Any]] = []
    for name in args.shapes.split(","):
        try:
            rows += measure_shape(name, args)
        except Exception:  # one shape's failure (memory) must not lose the other's rows
            traceback.print_exc()
    for line in int4_ratios(rows):
        print(line)
    path = write_results(args.out, "decode_graphs", dict(device=device, args=vars(args), rows=rows))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
