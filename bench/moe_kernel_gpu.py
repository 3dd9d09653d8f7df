"""The fused MoE kernel on a GPU at Qwen3-30B-A3B's MoE shape, against a per-expert loop.

The Triton kernel (shard/platforms/cuda/kernels/fused_moe.py) at Qwen3-30B-A3B's MoE layer shape
(hidden 2048, moe_intermediate 768, 128 experts, top-8, bf16, silu), against two baselines on the
same inputs:

- "loop": the per-expert Python loop every platform without a fused kernel runs
  (shard/platforms/grouped_moe.grouped_experts, with the CUDA platform's SwiGLU kernel as the
  CUDA platform would call it): a gate_up and a down GEMM per expert the step touches, plus
  the host sync its bincount needs. Its output is the reference the kernel is checked against.
- "dense": two plain GEMMs with the FLOPs of the active experts, x [T, H] @ [H, 2 I K] and
  [T, I K] @ [I K, H] (no activation between): what the step would cost if every token's K
  experts were one dense MLP. At small T it also reads far fewer weight bytes than the
  experts' (K experts' worth instead of up to min(E, T K)), so it bounds from below.

And the same kernel with int4 experts ("int4": INT4_W, the layout of AWQ/GPTQ/compressed-tensors
checkpoints after load, groups of 128, random codes), the bf16 experts being those int4 weights
dequantized: "fused/int4" above 1 means int4 experts beat bf16 ones (decode reads a quarter of
the bytes). Its max|diff| is against the bf16 fused kernel on the dequantized weights.

    .venv/bin/python -m bench.moe_kernel_gpu [--batches 1,2,4,...,256] [--repeats 50]
                                             [--warmup 10] [--no-graph]

Routing is random (softmax of random logits, top-8, renormalised), fresh per batch size.
Each call is timed with CUDA events around it alone, after `--warmup` calls, the median of
`--repeats`, with L2 flushed before each (a 256 MiB write: the layer's 1.2 GiB of experts do
not stay in L2 between steps in serving either). "fused graph" replays the fused call from a
CUDA graph (how a decode step runs it, shard/platforms/cuda/graphs.py), which also checks the
call captures. Ratios are baseline / fused: above 1 means the kernel is faster. max|diff| is
against the loop, and a row fails past 3e-2 (bf16: the loop weights and sums its K rows in
bf16, the kernel in fp32; both round act(gate) * up); any failure makes the exit status 1.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

# The repository's kernels, not whatever copy of the package an environment may have installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HIDDEN = 2048
INTERMEDIATE = 768  # moe_intermediate_size
EXPERTS = 128
TOP_K = 8
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOLERANCE = 3e-2  # atol = rtol, bf16
INT4_GROUP = 128
L2_FLUSH_BYTES = 256 << 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--batches",
        default=",".join(map(str, BATCHES)),
        help="comma-separated token counts (default: %(default)s)",
    )
    p.add_argument("--repeats", type=int, default=50, help="timed calls per path (median)")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls per path first")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph replay column")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def median_ms(fn: Callable[[], object], warmup: int, repeats: int, flush: torch.Tensor) -> float:
    """Median of `repeats` calls, each between its own pair of CUDA events, L2 flushed before."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graphed(fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
    """fn captured in a CUDA graph (after one eager call outside the capture, which compiles
    the kernels): (its replay, the output tensor the replay writes)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def routing(
    tokens: int, gen: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random top-k routing as a Qwen3 MoE router produces it: (weights f32, ids int32)."""
    logits = torch.randn(tokens, EXPERTS, generator=gen).to(device)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), TOP_K, dim=-1)
    return (weights / weights.sum(-1, keepdim=True)).contiguous(), ids.to(torch.int32)


def int4_experts(experts: int, outputs: int, inputs: int, device: torch.device):
    """Random int4 experts (uniform codes, zero point 8, fp16 scales sized so the dequantized
    weights are ~N(0, 1 / inputs) like the bf16 ones)."""
    from shard.platforms.int4_experts import PACK, Int4Experts

    gen = torch.Generator(device).manual_seed(experts * outputs + inputs)
    words = torch.randint(-(2**31), 2**31 - 1, (experts, inputs // PACK, outputs), device=device,
                          dtype=torch.int32, generator=gen)  # fmt: skip
    groups = inputs // INT4_GROUP
    zeros = torch.full((experts, groups, outputs), 8, dtype=torch.uint8, device=device)
    # codes - 8 uniform on -8..7: standard deviation ~4.6
    scales = torch.rand(experts, groups, outputs, device=device, generator=gen) + 0.5
    scales = (scales / (4.6 * inputs**0.5)).half()
    return Int4Experts(words, zeros, scales, INT4_GROUP)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_kernel_gpu: needs CUDA (the kernel runs compiled)", file=sys.stderr)
        return 2
    import triton

    from shard.platforms.cuda import CudaPlatform
    from shard.platforms.cuda.kernels.fused_moe import default_tiles, fused_moe
    from shard.platforms.grouped_moe import grouped_experts

    device = torch.device("cuda")
    dtype = torch.bfloat16
    argv_shown = sys.argv[1:] if argv is None else argv
    print(f"command: {shlex.join(['python', '-m', 'bench.moe_kernel_gpu', *argv_shown])}")
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
          f"triton {triton.__version__}; CUDA {torch.version.cuda}")  # fmt: skip
    print(
        f"shape: hidden {HIDDEN}, intermediate {INTERMEDIATE}, {EXPERTS} experts, top-{TOP_K}, "
        f"{dtype}, silu; median of {args.repeats} after {args.warmup} warmup, L2 flushed"
    )

    gen = torch.Generator().manual_seed(args.seed)
    # Sized so that gate and up are ~N(0, 1) and the output O(1): errors read as relative.
    # The bf16 experts are the int4 ones dequantized, so both kernels compute the same layer.
    q13 = int4_experts(EXPERTS, 2 * INTERMEDIATE, HIDDEN, device)
    q2 = int4_experts(EXPERTS, HIDDEN, INTERMEDIATE, device)
    w13, w2 = q13.dequantize(dtype), q2.dequantize(dtype)
    # The dense pair: as many weight rows as K experts hold (the first K experts' own rows).
    dense_up = w13[:TOP_K].reshape(TOP_K * 2 * INTERMEDIATE, HIDDEN)
    dense_down = w2[:TOP_K].permute(1, 0, 2).reshape(HIDDEN, TOP_K * INTERMEDIATE)
    swiglu = CudaPlatform().swiglu
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)

    header = (
        f"{'T':>5} {'BLOCK_M':>7} {'fused ms':>9} {'graph ms':>9} {'loop ms':>9} "
        f"{'dense ms':>9} {'loop/fused':>10} {'dense/fused':>11} {'max|diff|':>9} "
        f"{'int4 ms':>8} {'fused/int4':>10} {'int4 diff':>9}  check"
    )
    print(header)
    print("-" * len(header))
    failed = 0
    for tokens in (int(b) for b in args.batches.split(",")):
        x = torch.randn(tokens, HIDDEN, generator=gen).to(device, dtype)
        topk_weights, topk_ids = routing(tokens, gen, device)
        h_dense = torch.empty(tokens, TOP_K * INTERMEDIATE, dtype=dtype, device=device)

        # The step's tensors bound as defaults: each closure keeps its own batch's.
        def fused(
            x: torch.Tensor = x, w: torch.Tensor = topk_weights, ids: torch.Tensor = topk_ids
        ) -> torch.Tensor:
            return fused_moe(x, w13, w2, w, ids, "silu")

        def loop(
            x: torch.Tensor = x, w: torch.Tensor = topk_weights, ids: torch.Tensor = topk_ids
        ) -> torch.Tensor:
            return grouped_experts(x, w13, w2, w, ids, "silu", swiglu=swiglu)

        def int4(
            x: torch.Tensor = x, w: torch.Tensor = topk_weights, ids: torch.Tensor = topk_ids
        ) -> torch.Tensor:
            return fused_moe(x, q13, q2, w, ids, "silu")

        def dense(x: torch.Tensor = x, h: torch.Tensor = h_dense) -> torch.Tensor:
            F.linear(x, dense_up)  # [T, 2 I K]; its FLOPs, not its values, are the point
            return F.linear(h, dense_down)

        with torch.inference_mode():
            ours, reference = fused(), loop()
            error = (ours.float() - reference.float()).abs()
            diff = float(error.max())  # NaN anywhere fails the check below too
            ok = bool((error <= TOLERANCE * (1 + reference.float().abs())).all())
            int4_error = (int4().float() - ours.float()).abs()
            int4_diff = float(int4_error.max())
            ok = ok and bool((int4_error <= TOLERANCE * (1 + ours.float().abs())).all())
            int4_ms = median_ms(int4, args.warmup, args.repeats, flush)
            fused_ms = median_ms(fused, args.warmup, args.repeats, flush)
            loop_ms = median_ms(loop, args.warmup, args.repeats, flush)
            dense_ms = median_ms(dense, args.warmup, args.repeats, flush)
            graph_ms = float("nan")
            if not args.no_graph:
                replay, captured = graphed(fused)
                graph_ms = median_ms(replay, args.warmup, args.repeats, flush)
                ok = ok and torch.equal(captured, ours)  # same kernels, same inputs: same bits
        failed += not ok
        block_m = default_tiles(tokens * TOP_K, EXPERTS, dtype).block_m
        print(f"{tokens:>5} {block_m:>7} {fused_ms:>9.3f} {graph_ms:>9.3f} {loop_ms:>9.3f} "
              f"{dense_ms:>9.3f} {loop_ms / fused_ms:>10.2f} {dense_ms / fused_ms:>11.2f} "
              f"{diff:>9.2e} {int4_ms:>8.3f} {fused_ms / int4_ms:>10.2f} {int4_diff:>9.2e}  "
              f"{'ok' if ok else 'FAIL'}", flush=True)  # fmt: skip
    if failed:
        print(f"{failed} batch size(s) failed the check against grouped_experts", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
