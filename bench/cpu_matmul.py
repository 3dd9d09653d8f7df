"""GEMM throughput of this CPU in bfloat16 vs float32, at the benchmark model's linear shapes.

    .venv/bin/python -m bench.cpu_matmul [--rows 1 16 32 128]

Decode at batch B multiplies [B, in] activations by every weight; prefill does the same with
B = prompt tokens. On CPUs without native bf16 matmul (no AVX512-BF16 / AMX) PyTorch's bf16
GEMM can be several times slower than fp32 once B grows, which then bounds every step.
"upcast" times casting bf16 operands to fp32 inside the call (weights kept in bf16).

The second table is what a decode step sees: `--layers` distinct weights of each shape (one per
layer, so each is read from DRAM rather than cache), multiplied plainly (F.linear) and packed
once into oneDNN's layout as the shard does (shard/platforms/cpu/matmul.py `prepare_weight`), in
bf16 and fp32, with the plain/packed ratio.
"""

from __future__ import annotations

import argparse
import time

import torch

# (name, in, out) of the SmolLM2-135M shape: fused qkv, o, fused gate_up, down, LM head.
SHAPES = [
    ("qkv", 576, 960),
    ("o", 576, 576),
    ("gate_up", 576, 3072),
    ("down", 1536, 576),
    ("lm_head", 576, 49152),
]


def best_seconds(fn, repeats: int = 3, calls: int = 10) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def linear_seconds(x: torch.Tensor, w: torch.Tensor, upcast: bool = False) -> float:
    if upcast:
        return best_seconds(lambda: torch.nn.functional.linear(x.float(), w.float()))
    return best_seconds(lambda: torch.nn.functional.linear(x, w))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 32, 128])
    p.add_argument("--layers", type=int, default=30, help="distinct weights per shape (cold)")
    args = p.parse_args(argv)
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {capability}")
    header = ["shape", "rows", "bf16 ms", "fp32 ms", "upcast ms", "bf16 GF/s", "fp32 GF/s"]
    print(" ".join(f"{h:>9}" for h in header))
    for name, n_in, n_out in SHAPES:
        w32 = torch.randn(n_out, n_in)
        w16 = w32.bfloat16()
        for rows in args.rows:
            x32 = torch.randn(rows, n_in)
            t16 = linear_seconds(x32.bfloat16(), w16)
            t32 = linear_seconds(x32, w32)
            tup = linear_seconds(x32.bfloat16(), w16, upcast=True)
            gflop = 2 * rows * n_in * n_out / 1e9
            cells = [f"{t * 1e3:9.2f}" for t in (t16, t32, tup)]
            cells += [f"{gflop / t16:9.1f}", f"{gflop / t32:9.1f}"]
            print(f"{name:>9} {rows:>9} " + " ".join(cells))
    cold_weights(args.rows, args.layers)


def cold_weights(row_counts: list[int], layers: int) -> None:
    from shard.platforms.cpu.matmul import linear, prepare_weight

    print(f"\n{layers} distinct weights per shape (read from DRAM), ms for all of them")
    header = ["shape", "rows", "bf16", "bf16 pack", "ratio", "fp32", "fp32 pack", "ratio"]
    print(" ".join(f"{h:>9}" for h in header))
    for name, n_in, n_out in SHAPES:
        count = 1 if name == "lm_head" else layers
        for rows in row_counts:
            cells = []
            for dtype in (torch.bfloat16, torch.float32):
                ws = [torch.randn(n_out, n_in).to(dtype) for _ in range(count)]
                packed = [prepare_weight(w) for w in ws]
                x = torch.randn(rows, n_in).to(dtype)
                plain_s = best_seconds(
                    lambda x=x, ws=ws: [torch.nn.functional.linear(x, w) for w in ws], calls=2
                )
                packed_s = best_seconds(
                    lambda x=x, packed=packed: [linear(x, w) for w in packed], calls=2
                )
                cells += [
                    f"{plain_s * 1e3:9.2f}",
                    f"{packed_s * 1e3:9.2f}",
                    f"{plain_s / packed_s:8.2f}x",
                ]
            print(f"{name:>9} {rows:>9} " + " ".join(cells))


if __name__ == "__main__":
    main()
