"""The torch backend's decode attention against the paths it replaced, side by side: one query
per sequence over a paged KV cache, at the SmolLM2 head layout (9 query heads sharing 3 KV
heads, head_dim 64), block size 16, each sequence's blocks scattered through the cache.

    .venv/bin/python -m bench.decode_attention [--dtype bfloat16] [--repeats 50]

"matmul" is the first path: gathered K/V widened to fp32 heads-first copies, two batched
matmuls and a softmax between. "sdpa" is the backend's torch path: the gathered rows go to SDPA
as strided 4-D views (its CPU flash kernel). "native" is `TorchAttentionBackend.decode` as it
runs where its kernel builds (shard/platforms/cpu/native/build.py): the cache read in place through
the block tables (the column is blank where it cannot be built). Each row prints the median time
of a layer's call, sdpa / native, and every path's largest error against a float64 computation
of the same attention (all round to the model dtype once at the end; bf16's own rounding of the
output is printed beside them as the scale to read them on). Sequences of one batch have
different lengths (the longest sets the padded width), as in serving. The cache is the case's
alone, small enough to stay in the CPU's caches: in a model step it comes from memory, where
reading it once rather than three times matters more.
"""

from __future__ import annotations

import argparse

from bench.sdpa_layouts import add_layout_args, median_ms

CASES = [(1, 128), (16, 144), (16, 512), (32, 144), (32, 1024), (4, 2048)]  # (batch, context)
BLOCK_SIZE = 16


def matmul_decode(torch, q, kv_cache, meta, scale):  # type: ignore[no-untyped-def]
    """The former decode path (before SDPA), kept here as the baseline it is measured against."""
    from shard.platforms.cpu.attention import _decode_gather_index, _slot_rows

    keys, values = _slot_rows(kv_cache)
    flat, bias = _decode_gather_index(meta, kv_cache.shape[2], None, torch.float32)
    batch, num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[1]

    def heads_first(rows):  # type: ignore[no-untyped-def]
        gathered = rows.index_select(0, flat).view(batch, -1, num_kv_heads, head_dim)
        return gathered.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)

    grouped = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim).float() * scale
    scores = torch.matmul(grouped, heads_first(keys).transpose(-1, -2)).add_(bias)
    out = torch.matmul(torch.softmax(scores, dim=-1), heads_first(values))
    return out.reshape(batch, num_heads, head_dim).to(q.dtype)


def exact_decode(torch, q, kv_cache, meta, scale):  # type: ignore[no-untyped-def]
    """The same attention in float64, sequence by sequence, from the block tables."""
    outs = []
    keys, values = (kv_cache[i].flatten(0, 1).double() for i in (0, 1))
    group = q.shape[1] // keys.shape[1]
    for row, length in enumerate(meta.context_lens.tolist()):
        positions = torch.arange(length)
        slots = meta.block_tables[row].long()[positions // BLOCK_SIZE] * BLOCK_SIZE
        slots += positions % BLOCK_SIZE
        k = keys[slots].repeat_interleave(group, dim=1)  # [L, H, D]
        v = values[slots].repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[row].double() * scale, k)
        outs.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), v))
    return torch.stack(outs)


def build_case(torch, batch: int, context: int, args):  # type: ignore[no-untyped-def]
    from shard.attention.metadata import AttentionMetadata

    dtype = getattr(torch, args.dtype)
    # Lengths spread below the longest, as a served batch's are.
    lengths = [max(1, context - (i * 7) % (context // 2 + 1)) for i in range(batch)]
    lengths[0] = context
    blocks_per_row = -(-context // BLOCK_SIZE)
    num_blocks = batch * blocks_per_row + 8
    generator = torch.Generator().manual_seed(batch * 1000 + context)
    order = torch.randperm(num_blocks, generator=generator)[: batch * blocks_per_row]
    block_tables = order.view(batch, blocks_per_row).int()
    shape = (2, num_blocks, BLOCK_SIZE, args.kv_heads, args.head_dim)
    kv_cache = torch.randn(shape, generator=generator).to(dtype)
    q = torch.randn(batch, args.heads, args.head_dim, generator=generator).to(dtype)
    meta = AttentionMetadata(
        is_prefill=False,
        slot_mapping=torch.zeros(batch, dtype=torch.long),  # unused by decode itself
        block_tables=block_tables,
        context_lens=torch.tensor(lengths, dtype=torch.int32),
    )
    return q, kv_cache, meta


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_layout_args(p, repeats=50)
    args = p.parse_args(argv)

    import torch

    from shard.platforms.cpu import attention as torch_backend
    from shard.platforms.cpu.native.build import paged_decode_kernel

    backend = torch_backend.TorchAttentionBackend()
    torch_path = torch_backend.TorchAttentionBackend(native=False)
    kernel = paged_decode_kernel()
    scale = args.head_dim**-0.5
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}")
    header = ("batch", "context", "matmul ms", "sdpa ms", "native ms", "sdpa/nat")
    header += ("matmul err", "sdpa err", "native err", "rounding")
    print(" ".join(f"{h:>10}" for h in header))
    rows = []
    for batch, context in CASES:
        q, kv_cache, meta = build_case(torch, batch, context, args)
        paths = {
            "matmul": lambda q=q, c=kv_cache, m=meta: matmul_decode(torch, q, c, m, scale),
            "sdpa": lambda q=q, c=kv_cache, m=meta: torch_path.decode(q, c, m, scale),
        }
        if kernel is not None:
            paths["native"] = lambda q=q, c=kv_cache, m=meta: backend.decode(q, c, m, scale)
        row: dict[str, float] = dict(batch=batch, context=context)
        with torch.inference_mode():
            exact = exact_decode(torch, q, kv_cache, meta, scale)
            for name, path in paths.items():
                row[f"{name}_ms"] = median_ms(path, args.repeats)
                row[f"{name}_err"] = float((path().double() - exact).abs().max())
            row["rounding"] = float((exact.to(q.dtype).double() - exact).abs().max())
        rows.append(row)
        nan = float("nan")
        ratio = row["sdpa_ms"] / row.get("native_ms", nan)
        print(f"{batch:>10} {context:>10} {row['matmul_ms']:>10.3f} {row['sdpa_ms']:>10.3f} "
              f"{row.get('native_ms', nan):>10.3f} {ratio:>9.2f}x {row['matmul_err']:>10.2g} "
              f"{row['sdpa_err']:>10.2g} {row.get('native_err', nan):>10.2g} "
              f"{row['rounding']:>10.2g}")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
