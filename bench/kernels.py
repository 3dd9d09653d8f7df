"""The Triton kernels on a GPU: achieved bandwidth (decode, KV write, W4A16) or FLOP/s (prefill),
against the device's peak and against a torch baseline on the same shapes (SDPA for attention,
torch.matmul with the dense fp16 weight for the W4A16 GEMM: bench/kernels_w4a16.py).

    .venv/bin/python bench/kernels.py            # needs CUDA; prints one table
    .venv/bin/python bench/kernels.py --sweep    # also times the candidate tile configs
    .venv/bin/python bench/kernels.py --smoke    # CPU, TRITON_INTERPRET=1, tiny shapes: checks
                                                 # the script runs; its numbers mean nothing

Shapes are Llama-3-8B-like (32 query heads, 8 KV heads, head dim 128, bf16, 16-token blocks):
decode at batch 64 x 4096 context (target >= 70% of HBM bandwidth), split-K decode at batch 2 x
32k context, sliding-window decode at batch 64 x 16k context with a 4k window (should cost what a
4k context does), causal prefill of one 8192-token sequence (target: at least SDPA's flash
backend).
SDPA gets dense, contiguous K/V (no block table), which is the best case for it. W4A16: Llama-2-7B's
linears at M = 1, 16, 256 and 4096 tokens (targets: >= 3x torch at M = 1, >= 0.9x at 4096).
LoRA: shrink + expand of Llama-3-8B's q/k/v and down_proj at rank 16, decode and prefill steps,
against the torch path's per-slot loop (bench/kernels_lora.py).
Ratios are baseline time / ours: above 1 means ours is faster.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

# The repository's kernels, not whatever copy of the package an environment may have installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernel_report import Result, device_peak, report, timer  # noqa: E402
from bench.kernels_lora import bench_lora  # noqa: E402
from bench.kernels_w4a16 import bench_w4a16  # noqa: E402


@dataclass(frozen=True)
class Shapes:
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    decode_batch: int = 64
    decode_context: int = 4096
    split_batch: int = 2
    split_context: int = 32768
    prefill_tokens: int = 8192
    window: int = 4096
    dtype: torch.dtype = torch.bfloat16


SMOKE = Shapes(4, 2, 64, 16, 3, 48, 1, 96, 48, 32, torch.bfloat16)


def paged_cache(s: Shapes, batch: int, context: int, device: torch.device):
    """A cache holding `batch` sequences of `context` tokens in shuffled (non-contiguous) blocks,
    plus the same keys/values densely laid out for SDPA: [B, Hkv, context, D]."""
    blocks_per_seq = context // s.block_size
    num_blocks = batch * blocks_per_seq
    cache = torch.randn(
        2, num_blocks, s.block_size, s.kv_heads, s.head_dim, dtype=s.dtype, device=device
    )
    tables = torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq).int()
    dense = cache[:, tables.long()].flatten(2, 3).permute(0, 1, 3, 2, 4).contiguous()
    return cache, tables, dense[0], dense[1]


def sdpa(q, k, v, causal: bool):
    """SDPA with GQA; where the dispatcher has no GQA path for a backend, repeat KV heads."""
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    except RuntimeError:
        group = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def bench_decode(s, bench, device, batch, context, name, splits=None, sweep=False, window=None):
    """With `window`, each query sees its last `window` tokens: the bytes read, and SDPA's
    dense K/V, are the window's."""
    from shard.platforms.cuda.kernels.decode import (
        DecodeConfig,
        choose_num_splits,
        num_sms,
        paged_decode,
    )

    cache, tables, k, v = paged_cache(s, batch, context, device)
    if window is not None:
        k, v = k[:, :, -window:].contiguous(), v[:, :, -window:].contiguous()
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, s.heads, s.head_dim, dtype=s.dtype, device=device)
    scale = s.head_dim**-0.5

    def ours(num_splits=None, config=None):
        return paged_decode(
            q, cache, tables, lens, scale, window=window, num_splits=num_splits, config=config
        )

    # Every K/V byte each query sees once, plus q and out.
    work = 2 * k.numel() * k.element_size() + 2 * q.numel() * q.element_size()
    chosen = choose_num_splits(batch, s.kv_heads, min(context, window or context), num_sms(device))
    results = []
    for forced in [splits] if splits is not None else [None, 1]:
        ms = bench(lambda f=forced: ours(num_splits=f))
        used = chosen if forced is None else forced
        label = f"{name} splits={used}" + (" (heuristic)" if forced is None else " (forced)")
        results.append(Result(label, ms, work, "TB/s"))
        if forced is None and chosen == 1:
            break  # forcing 1 would time the same launch again
    baseline_ms = bench(lambda: sdpa(q.unsqueeze(2), k, v, causal=False))
    expected = sdpa(q.unsqueeze(2), k, v, causal=False).squeeze(2)
    # results may stop after the heuristic's run (see above): zip to the shorter.
    for r, forced in zip(results, [splits] if splits is not None else [None, 1], strict=False):
        r.baseline_ms = baseline_ms
        got = ours(num_splits=forced)
        r.max_err = (got.float() - expected.float()).abs().max().item()
    if sweep:
        for cfg in (DecodeConfig(32, 4, 2), DecodeConfig(64, 4, 3), DecodeConfig(64, 8, 2),
                    DecodeConfig(128, 4, 2), DecodeConfig(128, 8, 3)):  # fmt: skip
            ms = bench(lambda c=cfg: ours(config=c))
            label = f"  sweep N={cfg.block_n} warps={cfg.num_warps} stages={cfg.num_stages}"
            results.append(Result(label, ms, work, "TB/s"))
    return results


def bench_prefill(s, bench, device, sweep=False):
    from shard.platforms.cuda.kernels.prefill import PrefillConfig, varlen_prefill

    t = s.prefill_tokens
    q = torch.randn(t, s.heads, s.head_dim, dtype=s.dtype, device=device)
    k = torch.randn(t, s.kv_heads, s.head_dim, dtype=s.dtype, device=device)
    v = torch.randn_like(k)
    cu = torch.tensor([0, t], dtype=torch.int32, device=device)
    # The serving path: a paged cache is passed and context_lens == query length (no prefix).
    cache = torch.empty(2, 1, s.block_size, s.kv_heads, s.head_dim, dtype=s.dtype, device=device)
    tables = torch.zeros(1, 1, dtype=torch.int32, device=device)
    lens = torch.tensor([t], dtype=torch.int32, device=device)
    scale = s.head_dim**-0.5

    def ours(cfg=None):
        return varlen_prefill(
            q, k, v, cu, cu, t, scale,
            kv_cache=cache, block_tables=tables, context_lens=lens, config=cfg,
        )  # fmt: skip

    # Two matmuls of 2 FLOPs per multiply-add over the causal half of the score matrix.
    work = 2 * t * t * s.heads * s.head_dim
    dense = [x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)]
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def baseline():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return sdpa(*dense, causal=True)
    else:

        def baseline():
            return sdpa(*dense, causal=True)

    results = [Result(f"prefill causal {t} tok", bench(ours), work, "TFLOP/s", bench(baseline))]
    expected = baseline()[0].transpose(0, 1)
    results[0].max_err = (ours().float() - expected.float()).abs().max().item()
    if sweep:
        for cfg in (PrefillConfig(128, 64, 8, 3), PrefillConfig(128, 128, 8, 3),
                    PrefillConfig(128, 64, 4, 3), PrefillConfig(64, 64, 4, 3),
                    PrefillConfig(128, 32, 4, 4)):  # fmt: skip
            label = (
                f"  sweep M={cfg.block_m} N={cfg.block_n} warps={cfg.num_warps} "
                f"stages={cfg.num_stages}"
            )
            results.append(Result(label, bench(lambda c=cfg: ours(c)), work, "TFLOP/s"))
    return results


def bench_kv_write(s, bench, device):
    from shard.platforms.cuda.kernels.kv_write import kv_write

    t = s.prefill_tokens
    key = torch.randn(t, s.kv_heads, s.head_dim, dtype=s.dtype, device=device)
    value = torch.randn_like(key)
    num_blocks = t // s.block_size
    cache = torch.empty(
        2, num_blocks, s.block_size, s.kv_heads, s.head_dim, dtype=s.dtype, device=device
    )
    slots = torch.randperm(num_blocks * s.block_size, device=device)[:t]
    work = 4 * key.numel() * key.element_size()  # read k and v, write both
    ms = bench(lambda: kv_write(key, value, cache, slots))
    rows = cache.view(2, -1, s.kv_heads, s.head_dim)

    def torch_store():  # what the torch backend does; no SDPA equivalent exists
        rows[0].index_copy_(0, slots, key)
        rows[1].index_copy_(0, slots, value)

    return [Result(f"kv write {t} tok", ms, work, "TB/s", bench(torch_store), "vs index_copy_")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time candidate tile configs")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, CPU interpreter")
    parser.add_argument(
        "--only", help="comma-separated sections: decode,prefill,kv_write,w4a16,lora (default all)"
    )
    args = parser.parse_args()
    if args.smoke:
        # Before the first import of triton (shard.platforms.cuda.kernels imports it).
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        print(
            "bench/kernels.py measures GPU kernels and needs CUDA; no CUDA device is available "
            "here. (--smoke runs tiny shapes in the CPU interpreter to check the script itself.)",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    s = SMOKE if args.smoke else Shapes()
    bench = timer(args.smoke)
    torch.manual_seed(0)
    sections = {
        "decode": lambda: [
            *bench_decode(s, bench, device, s.decode_batch, s.decode_context,
                          f"decode B={s.decode_batch} ctx={s.decode_context}", sweep=args.sweep),
            *bench_decode(s, bench, device, s.split_batch, s.split_context,
                          f"decode B={s.split_batch} ctx={s.split_context}",
                          # The interpreter's "device" never wants splits at smoke sizes.
                          splits=3 if args.smoke else None),
            # Mistral-style: a context 4x the window costs what the window does.
            *bench_decode(s, bench, device, s.decode_batch, 4 * s.window,
                          f"decode B={s.decode_batch} ctx={4 * s.window} window={s.window}",
                          window=s.window),
        ],
        "prefill": lambda: bench_prefill(s, bench, device, sweep=args.sweep),
        "kv_write": lambda: bench_kv_write(s, bench, device),
        "w4a16": lambda: bench_w4a16(bench, device, args.smoke, args.sweep),
        "lora": lambda: bench_lora(bench, device, args.smoke),
    }  # fmt: skip
    wanted = args.only.split(",") if args.only else list(sections)
    unknown = sorted(set(wanted) - set(sections))
    if unknown:
        parser.error(f"--only: unknown sections {unknown}; known: {', '.join(sections)}")
    name, peak = device_peak()
    print(
        f"H={s.heads} Hkv={s.kv_heads} D={s.head_dim} {str(s.dtype).removeprefix('torch.')} "
        f"block_size={s.block_size}; w4a16: fp16, group 128; lora: bf16, rank 16"
    )
    failed = []
    # Each section's table is printed as soon as it is done, and one that fails does not take
    # the others' numbers with it: a GPU lease is short, and a rerun costs minutes of it.
    for section in wanted:
        try:
            results = sections[section]()
        except Exception:  # noqa: BLE001 (reported, and the exit status says so)
            traceback.print_exc()
            failed.append(section)
            continue
        print(f"\n## {section}", flush=True)
        report(results, name, None if args.smoke else peak)
        sys.stdout.flush()
    if failed:
        print(f"failed sections: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
