"""A shard built in process, as `python -m shard serve` builds it (world size 1, no gRPC), and a
batch ready to decode on it: what the in-process benchmarks (roofline, profile_decode,
profile_lora) time.

Everything runs on the calling thread, model loading included. The server loads and steps on one
dedicated thread because torch keeps an OpenMP pool per calling thread; loading on one thread
and stepping on another leaves two pools competing for the cores, which made every small GEMM
several times slower (a [16, 16] x [16, 576] bf16 matmul: ~15-20 us on one pool, ~65 us with
two) and once misled a LoRA measurement."""

from __future__ import annotations

from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

from bench.shard_batches import cache_tokens_needed, make_batch


def model_dir_or_default(model_dir: Path | None) -> Path:
    """None: the random-weight SmolLM2-135M-shaped model (built once, cached)."""
    if model_dir is not None:
        return model_dir
    from bench.build_smollm_shape import build, default_dir

    return build(default_dir())


class _Inline(Executor):
    """An executor that runs what it is given on the calling thread."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        future: Future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def build_shard(model_dir: Path, dtype: str, **settings: Any):  # -> TextGenerationService
    from shard.settings import ShardSettings
    from shard.startup import build_service

    return build_service(
        ShardSettings(model_id=str(model_dir), uds_path="/dev/null", dtype=dtype, **settings),
        torch_thread=_Inline(),  # type: ignore[arg-type]
    )


def prefilled_batch(  # type: ignore[no-untyped-def]
    runner, batch: int, seq_len: int, decode_steps: int, sampling: dict | None = None
):  # -> shard Batch
    """`batch` requests of `seq_len` prompt tokens, prefilled, with KV room for `decode_steps`
    more steps (the runner's KV cache is sized for exactly that); greedy, or with `sampling`
    (bench.shard_batches.make_batch)."""
    from shard import wire
    from shard.server import run_warmup_steps

    block = runner.block_size
    runner.allocate_kv_cache(cache_tokens_needed(batch, seq_len, decode_steps + 1, block) // block)
    pb_batch = make_batch(
        1, batch, seq_len, decode_steps, block, runner.model.vocab_size, sampling=sampling
    )
    if runner.compiled:  # the graphs a served shard has compiled at its warmup
        run_warmup_steps(runner, pb_batch)
    state = wire.new_batch(pb_batch, runner.device)[0]
    runner.step(state)
    return state
