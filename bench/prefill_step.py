"""A burst's prefill step in process: the native prefill attention (on the AMX tile unit in bf16
where the CPU has one) and the fused SwiGLU epilogue each against the paths they replaced, side
by side in one run.

    PYTHONPATH=. .venv/bin/python -m bench.prefill_step [--batch 16] [--seq-len 59] [--rounds 6]

The step is what a closed loop's first wave costs: `--batch` prompts of `--seq-len` tokens
arriving together and prefilled in one step (the TTFT of the wave's last request). Four
configurations, alternated round by round so that drift in the machine's speed hits them all:
  both       the shard as it runs (native prefill attention for short prompts, on the tile
             unit where it can be; SwiGLU fused into the gate_up tile kernel)
  vector     prefill attention by the vector kernel (paged_prefill.cpp) instead of the tile one
  sdpa       prefill attention by SDPA per sequence (no native kernel)
  unfused    the gate_up product written out, then silu_and_mul (act_and_mul's SwiGLU)
  neither    both of the above
Prints each one's median step time and its ratio to `both`.
"""

from __future__ import annotations

import argparse
import statistics
import time

CONFIGS = ("both", "vector", "sdpa", "unfused", "neither")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=59)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args(argv)

    import torch

    from bench.inprocess import build_shard, model_dir_or_default
    from bench.shard_batches import cache_tokens_needed, make_batch
    from shard import wire
    from shard.layers.activation import silu_and_mul
    from shard.layers.linear import MergedColumnParallelLinear
    from shard.platforms.cpu import attention as torch_backend

    fused = MergedColumnParallelLinear.act_and_mul
    cells = torch_backend.NATIVE_PREFILL_CELLS, torch_backend.AMX_PREFILL_CELLS
    amx_attention = torch_backend.amx_paged_prefill_kernel

    def unfused(self, x, act):  # type: ignore[no-untyped-def]
        gate, up = self.split(self(x))
        return silu_and_mul(gate, up)

    def configure(name: str) -> None:
        sdpa = name in ("sdpa", "neither")
        torch_backend.NATIVE_PREFILL_CELLS, torch_backend.AMX_PREFILL_CELLS = (
            (0, 0) if sdpa else cells
        )
        torch_backend.amx_paged_prefill_kernel = (  # type: ignore[assignment]
            (lambda: None) if name == "vector" else amx_attention
        )
        MergedColumnParallelLinear.act_and_mul = (  # type: ignore[method-assign]
            unfused if name in ("unfused", "neither") else fused
        )

    service = build_shard(model_dir_or_default(None), args.dtype)
    runner = service.runner
    block = runner.block_size
    runner.allocate_kv_cache(cache_tokens_needed(args.batch, args.seq_len, 4, block) // block)
    vocab = runner.model.vocab_size

    def step_seconds() -> float:
        pb = make_batch(1, args.batch, args.seq_len, 3, block, vocab)
        state = wire.new_batch(pb, runner.device)[0]
        t0 = time.perf_counter()
        runner.step(state)
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for name in CONFIGS:  # warm every path once
        configure(name)
        step_seconds()
    for _ in range(args.rounds):
        for name in CONFIGS:
            configure(name)
            times[name].append(min(step_seconds() for _ in range(2)))
    configure("both")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; prefill step of "
        f"{args.batch} x {args.seq_len} tokens, {args.dtype}, median of {args.rounds} rounds"
    )
    base = statistics.median(times["both"])
    for name in CONFIGS:
        ms = statistics.median(times[name]) * 1e3
        print(f"  {name:8s} {ms:8.1f} ms   {ms / (base * 1e3):.2f}x the shard's")


if __name__ == "__main__":
    main()
