"""The AMX tile kernel against oneDNN for a model's bf16 linears, weights read from memory.

    .venv/bin/python -m bench.amx_gemm [--rows 1 16 32 64 128 256 512 2048] [--weights-mib 1024]

A decode step multiplies each of a model's weights once by a few rows, so its GEMMs read every
weight from DRAM. Both paths here run the SmolLM2-135M shape's four layer weights (fused qkv, o,
fused gate_up, down), interleaved as a forward pass meets them, over as many distinct layers as
make `--weights-mib` (default 1 GiB: over twice this machine's 480 MiB shared L3, so no weight
is still cached when it comes round again). Each path holds its own packed copies, made as the
shard makes them (shard/platforms/cpu/matmul.py): oneDNN's blocked layout, and the tile kernel's.
Prints the time per 30 layers (the model's count), the weight read rate, and oneDNN / AMX. The
AMX column is the kernel itself at every row count; the shard hands steps of
`matmul_amx.ONEDNN_ROWS` rows or more to oneDNN instead.
"""

from __future__ import annotations

import argparse
import time

import torch

# (out, in) of the SmolLM2-135M shape's layer weights: fused qkv, o, fused gate_up, down.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
MODEL_LAYERS = 30


def best_seconds(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 32, 64, 128, 256, 512, 2048])
    p.add_argument("--weights-mib", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)

    from shard.platforms.cpu import matmul_amx
    from shard.platforms.cpu.native.build import amx_linear_kernel

    kernel = amx_linear_kernel()
    if kernel is None:
        raise SystemExit(
            "no AMX tile kernel here (a CPU with AMX-BF16 is needed): nothing to compare"
        )
    layer_bytes = sum(n * k * 2 for n, k in SHAPES)
    layers = max(1, args.weights_mib * 2**20 // layer_bytes)
    torch.manual_seed(0)
    onednn, tiles = [], []
    for _ in range(layers):
        for n, k in SHAPES:
            w = (torch.randn(n, k) * 0.05).bfloat16()
            onednn.append(torch.ops.mkldnn._reorder_linear_weight(w, 16))
            tiles.append(matmul_amx.pack(w))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {layers} layers of "
        f"{layer_bytes / 2**20:.1f} MiB ({layers * layer_bytes / 2**20:.0f} MiB per pass)"
    )
    header = [("rows", 5), ("oneDNN ms", 10), ("AMX ms", 8), ("oneDNN GB/s", 12), ("AMX GB/s", 9)]
    print(" ".join(f"{name:>{width}}" for name, width in header), f"{'ratio':>6}")
    for rows in args.rows:
        xs = {k: torch.randn(rows, k).bfloat16() for k in {k for _, k in SHAPES}}
        check_x = xs[SHAPES[0][1]]
        want = torch.ops.mkldnn._linear_pointwise(check_x, onednn[0], None, "none", [], "")
        got = kernel(check_x, tiles[0], None)
        # Same products and fp32 sums: at most a rounding apart, never a different matrix.
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)

        def run_onednn(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in onednn:
                torch.ops.mkldnn._linear_pointwise(xs[w.size(1)], w, None, "none", [], "")

        def run_tiles(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in tiles:
                kernel(xs[w.shape[1] * matmul_amx.BLOCK_IN], w, None)

        t_dnn = best_seconds(run_onednn, args.repeats)
        t_amx = best_seconds(run_tiles, args.repeats)
        per30 = MODEL_LAYERS / layers * 1e3
        total = layers * layer_bytes
        print(
            f"{rows:>5} {t_dnn * per30:>10.2f} {t_amx * per30:>8.2f} {total / t_dnn / 1e9:>12.1f} "
            f"{total / t_amx / 1e9:>9.1f} {t_dnn / t_amx:>5.2f}x"
        )
    x = torch.ones(2**28)
    seconds = best_seconds(lambda: x.sum(), args.repeats)
    print(f"read bandwidth (a 1 GiB sum, same threads): {x.numel() * 4 / seconds / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
