"""A Mixture-of-Experts layer's experts on this CPU, in process: the one native call
(shard/platforms/cpu/native/rows_moe.cpp) against the torch form it replaces
(shard/platforms/grouped_moe.py with the rows kernel's linear) and against the same torch form
on torch's own bf16 linear, side by side with ratios; and the rows kernel's read rate of cold
weights at a decode step's row counts.

    .venv/bin/python -m bench.moe_cpu [--tokens 1 4 16 32] [--layers 8]

The shape is bench/build_moe_shape.py's (hidden 512, 16 experts of 768, top-2, bf16), with
`--layers` distinct weight sets so each call reads its experts from DRAM, as a decode step
does. Every form's output is checked equal to the native call's first (the torch form's bit
for bit; torch's linear sums in another order, within bf16 rounding). Run on a quiet machine.
"""

from __future__ import annotations

import argparse
import time

import torch

HIDDEN, EXPERTS, INTER, TOP_K = 512, 16, 768, 2


def best_ms(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def experts_table(token_counts: list[int], layers: int, repeats: int) -> None:
    from shard.platforms import grouped_moe
    from shard.platforms.cpu import CpuPlatform, matmul

    gen = torch.Generator().manual_seed(0)
    w13 = [(torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) * 0.05).bfloat16()
           for _ in range(layers)]  # fmt: skip
    w2 = [(torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) * 0.05).bfloat16()
          for _ in range(layers)]  # fmt: skip
    swiglu = CpuPlatform().swiglu
    forms = {
        "one call": dict(swiglu=swiglu, linear=matmul.linear, swiglu_experts=matmul.swiglu_experts),
        "torch form": dict(swiglu=swiglu, linear=matmul.linear),
        "torch linear": dict(),
    }
    print(f"experts of {layers} layers (E={EXPERTS}, I={INTER}, H={HIDDEN}, top-{TOP_K}, bf16)")
    print(f"{'tokens':>6} " + " ".join(f"{name + ' ms':>15}" for name in forms) + "   ratios")
    for tokens in token_counts:
        x = torch.randn(tokens, HIDDEN, generator=gen).bfloat16()
        ids = [torch.rand(tokens, EXPERTS, generator=gen).topk(TOP_K, dim=1).indices.int()
               for _ in range(layers)]  # fmt: skip
        weights = [torch.rand(tokens, TOP_K, generator=gen) for _ in range(layers)]

        def run(kwargs: dict, layer: int, x=x, weights=weights, ids=ids) -> torch.Tensor:  # type: ignore[no-untyped-def]
            return grouped_moe.grouped_experts(
                x, w13[layer], w2[layer], weights[layer], ids[layer], "silu", **kwargs
            )

        native = run(forms["one call"], 0)
        assert torch.equal(run(forms["torch form"], 0), native)
        torch.testing.assert_close(run(forms["torch linear"], 0), native, atol=2e-2, rtol=2e-2)
        ms = {
            name: best_ms(lambda kw=kwargs: [run(kw, layer) for layer in range(layers)], repeats)
            for name, kwargs in forms.items()
        }
        one = ms["one call"]
        ratios = ", ".join(f"{name} {ms[name] / one:.2f}x" for name in forms if name != "one call")
        print(f"{tokens:>6} " + " ".join(f"{ms[name]:>15.1f}" for name in forms) + f"   {ratios}")


def rows_table(row_counts: list[int], repeats: int) -> None:
    from shard.platforms.cpu.native import build as native

    kernel = native.rows_linear_kernel()
    if kernel is None:
        print("no rows kernel on this CPU (it needs AVX2, FMA and F16C)")
        return
    shapes = [("expert gate_up", 2 * INTER, HIDDEN, 64), ("expert down", HIDDEN, INTER, 64),
              ("lm_head", 49152, HIDDEN, 2)]  # fmt: skip
    print("\nthe rows kernel on cold weights (distinct copies, each read once per pass)")
    print(f"{'shape':>15} {'rows':>5} {'us':>9} {'GB/s':>6} {'GFLOP/s':>8}")
    gen = torch.Generator().manual_seed(1)
    for name, out_f, in_f, copies in shapes:
        ws = [torch.randn(out_f, in_f, generator=gen).bfloat16() for _ in range(copies)]
        for rows in row_counts:
            x = torch.randn(rows, in_f, generator=gen).bfloat16()
            ms = best_ms(lambda x=x, ws=ws: [kernel(x, w, None) for w in ws], repeats) / copies
            seconds = ms / 1e3
            gbs = out_f * in_f * 2 / seconds / 1e9
            gflops = 2 * rows * out_f * in_f / seconds / 1e9
            print(f"{name:>15} {rows:>5} {1e3 * ms:>9.1f} {gbs:>6.1f} {gflops:>8.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 32])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    experts_table(args.tokens, args.layers, args.repeats)
    rows_table(args.rows, args.repeats)


if __name__ == "__main__":
    main()
