"""Why the torch backend's prefill hands SDPA 4-D tensors: the same prompt-chunk attention with
3-D inputs ([heads, tokens, D], what it passed before) and with a leading batch dim of 1, side by
side, at the SmolLM2 head layout (9 query heads sharing 3 KV heads, head_dim 64).

    .venv/bin/python -m bench.sdpa_layouts [--dtype bfloat16] [--repeats 20]

Each row: a chunk of `tokens` new tokens after `prefix` cached ones (the chunked-prefill case),
causal boolean mask as the backend builds it. Prints the median time of each layout and the
ratio; on CPU torch takes its fused flash kernel only for 4-D inputs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

CASES = [(64, 0), (256, 0), (512, 0), (44, 256), (256, 256)]  # (tokens, prefix)


def _attend(F, q, k, v, mask, scale, *, batched: bool):  # type: ignore[no-untyped-def]
    """[heads, tokens, D] inputs as they are, or with a leading batch dim of 1."""
    if not batched:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    out = F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out[0]


def median_ms(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def add_layout_args(p: argparse.ArgumentParser, repeats: int) -> None:
    """The attention benchmarks' shared flags: dtype, the SmolLM2 head layout, repeats."""
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=repeats)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_layout_args(p, repeats=20)
    args = p.parse_args(argv)

    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}")
    header = ("tokens", "prefix", "3-D ms", "4-D ms", "3-D / 4-D", "max diff")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (6, 6, 8, 8, 9, 9), strict=True)))
    for tokens, prefix in CASES:
        torch.manual_seed(0)
        q = torch.randn(tokens, args.heads, args.head_dim, dtype=dtype).transpose(0, 1)
        k, v = (
            torch.randn(prefix + tokens, args.kv_heads, args.head_dim, dtype=dtype).transpose(0, 1)
            for _ in range(2)
        )
        q_pos = torch.arange(prefix, prefix + tokens)[:, None]
        mask = torch.arange(prefix + tokens)[None, :] <= q_pos
        scale = args.head_dim**-0.5

        three_d = partial(_attend, F, q, k, v, mask, scale, batched=False)
        four_d = partial(_attend, F, q, k, v, mask, scale, batched=True)

        with torch.inference_mode():
            old, new = median_ms(three_d, args.repeats), median_ms(four_d, args.repeats)
            diff = (three_d().float() - four_d().float()).abs().max().item()
        print(f"{tokens:>6} {prefix:>6} {old:>8.3f} {new:>8.3f} {old / new:>8.2f}x {diff:>9.2g}")


if __name__ == "__main__":
    main()
