"""Int4 experts against the same experts in bf16 on this CPU, in process, side by side with
ratios: a Mixture-of-Experts layer's experts through the CPU platform's `fused_moe`, once with
the bf16 experts stacked (the native one-call path and the grouped GEMMs it falls back to) and
once with each expert one int4 linear (shard/layers/moe_int4.py: torch's CPU int4 kernel for a
decode step's rows, dequantize + GEMM past DENSE_MIN_ROWS). The bf16 experts are the int4
ones dequantized, so both compute the same layer; the outputs are checked within bf16's
rounding first.

    .venv/bin/python -m bench.moe_int4_cpu [--tokens 1 4 16 64 256] [--layers 8]

The shape is bench/moe_cpu.py's (hidden 512, 16 experts of 768, top-2), groups of 128, with
`--layers` distinct weight sets so each call reads its experts from DRAM, as a decode step
does. Run on a quiet machine.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from bench.moe_cpu import EXPERTS, HIDDEN, INTER, TOP_K, best_ms

GROUP = 128


def random_int4(outputs: int, inputs: int, gen: torch.Generator):  # type: ignore[no-untyped-def]
    """One expert's weight in the internal int4 layout: uniform codes, zero point 8, scales
    sized for weights of ~0.05 (bench/moe_cpu.py's)."""
    from shard.layers.quant.int4 import QuantizedWeight, pack_rows

    codes = torch.randint(0, 16, (inputs, outputs), generator=gen)
    groups = inputs // GROUP
    zeros = torch.full((groups, outputs), 8, dtype=torch.uint8)
    scales = ((torch.rand(groups, outputs, generator=gen) + 0.5) * 0.05 / 4.6).bfloat16()
    return QuantizedWeight(pack_rows(codes), zeros, scales, GROUP)


def layer_experts(gen: torch.Generator) -> dict[str, tuple]:  # type: ignore[type-arg]
    """{"bf16": (w13, w2) stacked, "int4": (w13, w2) as one int4 linear per expert}."""
    from shard.layers.quant.int4_linear import concat_columns, int4_weight

    gate_up, down = [], []
    for e in range(EXPERTS):
        pair = [random_int4(INTER, HIDDEN, gen) for _ in range(2)]
        gate_up.append(concat_columns(pair, [f"gate {e}", f"up {e}"]))
        down.append(random_int4(HIDDEN, INTER, gen))
    dense = tuple(
        torch.stack([qw.dequantize(torch.bfloat16).T.contiguous() for qw in kind])
        for kind in (gate_up, down)
    )
    int4 = tuple(
        nn.ModuleList(int4_weight(qw, torch.bfloat16, triton=False) for qw in kind)
        for kind in (gate_up, down)
    )
    return {"bf16": dense, "int4": int4}


def main() -> None:
    from shard.platforms.cpu import CpuPlatform

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"experts of {args.layers} layers (E={EXPERTS}, I={INTER}, H={HIDDEN}, top-{TOP_K}, "
        f"int4 groups of {GROUP} vs the same weights in bf16); best of {args.repeats}"
    )
    gen = torch.Generator().manual_seed(0)
    layers = [layer_experts(gen) for _ in range(args.layers)]
    platform = CpuPlatform()
    print(f"{'tokens':>6} {'bf16 ms':>9} {'int4 ms':>9} {'bf16/int4':>9} {'max|diff|':>9}")
    for tokens in args.tokens:
        x = torch.randn(tokens, HIDDEN, generator=gen).bfloat16()
        ids = [torch.rand(tokens, EXPERTS, generator=gen).topk(TOP_K, dim=1).indices.int()
               for _ in range(args.layers)]  # fmt: skip
        weights = [torch.rand(tokens, TOP_K, generator=gen) for _ in range(args.layers)]

        def run(kind: str, layer: int, x=x, ids=ids, weights=weights) -> torch.Tensor:  # type: ignore[no-untyped-def]
            w13, w2 = layers[layer][kind]
            return platform.fused_moe(x, w13, w2, weights[layer], ids[layer], "silu")

        dense, int4 = run("bf16", 0), run("int4", 0)
        diff = (dense.float() - int4.float()).abs().max().item()
        scale = dense.float().abs().max().item()
        assert diff <= 3e-2 * scale, (diff, scale)
        ms = {
            kind: best_ms(lambda k=kind: [run(k, i) for i in range(args.layers)], args.repeats)
            for kind in ("bf16", "int4")
        }
        print(
            f"{tokens:>6} {ms['bf16']:>9.2f} {ms['int4']:>9.2f} "
            f"{ms['bf16'] / ms['int4']:>9.2f} {diff:>9.2e}"
        )


if __name__ == "__main__":
    main()
