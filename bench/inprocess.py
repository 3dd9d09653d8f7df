"""A shard built in process, as `python -m shard serve` builds it (world size 1, no gRPC), and a
batch ready to decode on it: what the in-process benchmarks (roofline, profile_decode,
omp_threads) time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.shard_batches import cache_tokens_needed, make_batch


def model_dir_or_default(model_dir: Path | None) -> Path:
    """None: the random-weight SmolLM2-135M-shaped model (built once, cached)."""
    if model_dir is not None:
        return model_dir
    from bench.build_smollm_shape import build, default_dir

    return build(default_dir())


def build_shard(model_dir: Path, dtype: str, **settings: Any):  # -> TextGenerationService
    from shard.settings import ShardSettings
    from shard.startup import build_service

    return build_service(
        ShardSettings(model_id=str(model_dir), uds_path="/dev/null", dtype=dtype, **settings)
    )


def prefilled_batch(runner, batch: int, seq_len: int, decode_steps: int):  # -> shard Batch
    """`batch` requests of `seq_len` prompt tokens, prefilled, with KV room for `decode_steps`
    more steps (the runner's KV cache is sized for exactly that)."""
    from shard import wire

    block = runner.block_size
    runner.allocate_kv_cache(cache_tokens_needed(batch, seq_len, decode_steps + 1, block) // block)
    pb_batch = make_batch(1, batch, seq_len, decode_steps, block, runner.model.vocab_size)
    state = wire.new_batch(pb_batch, runner.device)[0]
    runner.step(state)
    return state
