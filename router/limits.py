"""Token limits: defaults derived from the model (like TGI) and the checks that make them safe.

Resolution happens in two stages: `resolve_limits` right after the Info RPC (flags + model
context length), `apply_capacity` after Warmup (what the shards' KV cache can actually hold).
Every failure is a `ConfigError` whose message names the offending flag, so the router can exit
with a clear line instead of failing on the first request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from router.args import RouterArgs

# TGI's historical defaults, capped by the model's context length.
DEFAULT_MAX_TOTAL_TOKENS = 2048
DEFAULT_MAX_INPUT_TOKENS = 1024
# The default prefill budget: TGI's launcher default (4096 prompt tokens a step, capped at the
# model's context length), and never less than one full prompt plus TGI's old headroom of 50.
# With the old default alone (max_input_tokens + 50 = 1074) a wave of 32 short prompts (p64 c=32
# in docs/benchmarks.md) went out in two steps, the second beside the first's 17 new decoders: a
# 210 ms inter-token gap for each of them, which was that level's ITL p99; in one step it is none.
DEFAULT_MAX_BATCH_PREFILL_TOKENS = 4096
PREFILL_HEADROOM = 50
# Prompt tokens a step may add while other requests decode (chunked prefill), on a CPU: a token
# costs 0.2-2 ms there by CPU and path (SmolLM2 shape; docs/benchmarks.md), and the chunk is the
# stall every decoding request sees. Measured best for eager steps; with the shards' --compile
# (tokens ~0.19 ms on the AMX Xeon) 256 traded better there. On a GPU the default is the whole
# --max-batch-prefill-tokens.
DEFAULT_CPU_PREFILL_CHUNK_TOKENS = 64
# Block 0 is never handed to a request: shards may pad slot mappings with slot 0.
RESERVED_BLOCKS = 1


class ConfigError(Exception):
    """A limit that cannot work; the message names the flag to change."""


@dataclass(frozen=True)
class Limits:
    max_input_tokens: int
    max_total_tokens: int
    max_batch_prefill_tokens: int
    # With chunking: prompt tokens per step while requests are decoding (<= the above).
    prefill_chunk_tokens: int
    # None until warmup: the flag's value when given, else what the KV cache holds.
    max_batch_total_tokens: int | None
    block_size: int
    num_blocks: int = 0
    max_supported_total_tokens: int = 0
    # The most sequences the shards run at once (their recurrent state slots); 0: no limit.
    shard_max_batch_size: int = 0

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    @property
    def usable_blocks(self) -> int:
        return max(self.num_blocks - RESERVED_BLOCKS, 0)

    @property
    def batch_total_tokens(self) -> int:
        """The effective batch budget; valid only after `apply_capacity`."""
        assert self.max_batch_total_tokens is not None, "limits used before warmup"
        return self.max_batch_total_tokens


def resolve_limits(
    args: RouterArgs, max_position_embeddings: int, block_size: int, device_type: str = "cuda"
) -> Limits:
    if block_size <= 0:
        raise ConfigError(f"the shards report block_size={block_size}; it must be positive")
    mpe = max_position_embeddings if max_position_embeddings > 0 else DEFAULT_MAX_TOTAL_TOKENS

    total = args.max_total_tokens
    if total is None:
        total = min(mpe, DEFAULT_MAX_TOTAL_TOKENS)
        if args.max_input_tokens is not None:
            # A user-given input limit must leave room for at least one new token.
            total = max(total, args.max_input_tokens + 1)
    max_input = args.max_input_tokens
    if max_input is None:
        max_input = (
            total - 1
            if args.max_total_tokens is not None
            else min(total - 1, DEFAULT_MAX_INPUT_TOKENS)
        )
    prefill = args.max_batch_prefill_tokens
    if prefill is None:
        prefill = max(max_input + PREFILL_HEADROOM, min(DEFAULT_MAX_BATCH_PREFILL_TOKENS, mpe))
        if args.max_batch_total_tokens is not None:
            prefill = min(prefill, args.max_batch_total_tokens)

    if max_input < 1:
        raise ConfigError(
            f"--max-total-tokens ({total}) leaves no room for a prompt; it must be >= 2"
        )
    if max_input >= total:
        raise ConfigError(
            f"--max-input-tokens ({max_input}) must be < --max-total-tokens ({total})"
        )
    if total > mpe and args.max_total_tokens is None:
        raise ConfigError(
            f"--max-input-tokens ({max_input}) must be < the model's "
            f"max_position_embeddings ({mpe})"
        )
    if total > mpe:
        raise ConfigError(
            f"--max-total-tokens ({total}) exceeds the model's max_position_embeddings ({mpe})"
        )
    batch_total = args.max_batch_total_tokens
    if batch_total is not None and batch_total < total:
        raise ConfigError(
            f"--max-batch-total-tokens ({batch_total}) must be >= --max-total-tokens ({total})"
        )
    if prefill < max_input and not args.prefill_chunking:
        raise ConfigError(
            f"--max-batch-prefill-tokens ({prefill}) must be >= --max-input-tokens ({max_input})"
            " with --no-prefill-chunking, or no full-length prompt could ever be prefilled"
        )
    if batch_total is not None:
        if batch_total < prefill:
            raise ConfigError(
                f"--max-batch-prefill-tokens ({prefill}) must be <= "
                f"--max-batch-total-tokens ({batch_total})"
            )
    chunk = args.prefill_chunk_tokens
    if chunk is None:
        chunk = min(prefill, DEFAULT_CPU_PREFILL_CHUNK_TOKENS) if device_type == "cpu" else prefill
    elif chunk > prefill:
        raise ConfigError(
            f"--prefill-chunk-tokens ({chunk}) must be <= --max-batch-prefill-tokens ({prefill})"
        )
    return Limits(
        max_input_tokens=max_input,
        max_total_tokens=total,
        max_batch_prefill_tokens=prefill,
        prefill_chunk_tokens=chunk,
        max_batch_total_tokens=batch_total,
        block_size=block_size,
    )


def apply_capacity(limits: Limits, max_supported_total_tokens: int, num_blocks: int) -> Limits:
    """Fits the limits to the KV cache the shards sized during warmup."""
    if num_blocks <= 0 or max_supported_total_tokens <= 0:
        raise ConfigError(
            f"the shards report an empty KV cache (num_blocks={num_blocks}, "
            f"max_supported_total_tokens={max_supported_total_tokens}); give them more memory"
        )
    if limits.max_total_tokens > max_supported_total_tokens:
        raise ConfigError(
            f"--max-total-tokens ({limits.max_total_tokens}) exceeds the "
            f"{max_supported_total_tokens} tokens the shards' KV cache holds; lower "
            "--max-total-tokens or give the shards more memory"
        )
    sized = replace(
        limits, num_blocks=num_blocks, max_supported_total_tokens=max_supported_total_tokens
    )
    needed = sized.blocks_for(limits.max_total_tokens)
    if needed > sized.usable_blocks:
        raise ConfigError(
            f"--max-total-tokens ({limits.max_total_tokens}) needs {needed} KV blocks of "
            f"{limits.block_size} tokens but only {sized.usable_blocks} are usable "
            f"({num_blocks} minus {RESERVED_BLOCKS} reserved); lower --max-total-tokens"
        )
    usable_tokens = sized.usable_blocks * limits.block_size
    batch_total = limits.max_batch_total_tokens
    if batch_total is None:
        batch_total = min(max_supported_total_tokens, usable_tokens)
    elif batch_total > max_supported_total_tokens:
        raise ConfigError(
            f"--max-batch-total-tokens ({batch_total}) exceeds the {max_supported_total_tokens} "
            "tokens the shards' KV cache holds; lower it or leave it unset"
        )
    # A batch never prefills more than it may hold; max_total_tokens <= batch_total (checked
    # above through the block count), so one full-length prompt still always fits.
    prefill = min(limits.max_batch_prefill_tokens, batch_total)
    return replace(
        sized,
        max_batch_total_tokens=batch_total,
        max_batch_prefill_tokens=prefill,
        prefill_chunk_tokens=min(limits.prefill_chunk_tokens, prefill),
    )
