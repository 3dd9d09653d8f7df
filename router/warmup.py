"""Startup: learn the model from the shards, warm them up, and fit the limits to their cache.

Warmup runs a worst-case prefill (requests of max_input_tokens filling max_batch_prefill_tokens,
with prompt logprobs and top-n tokens asked for). The shards' KV cache does not exist yet at
that point, so every warmup request uses the same small block range [0, n): the shards only
need scratch room for one request's worth of cache. Afterwards each shard sizes its cache from
the memory left and answers how many tokens fit.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from router.api.openai import MAX_LOGIT_BIAS_TOKENS
from router.args import RouterArgs
from router.block_allocator import slots_of
from router.client import ShardClient
from router.limits import RESERVED_BLOCKS, Limits, apply_capacity, resolve_limits
from router.validation import MAX_TOP_N_TOKENS
from switchyard_pb import generate_pb2 as pb

log = logging.getLogger(__name__)


def build_warmup_batch(
    limits: Limits, vocab_size: int, top_n_tokens: int = MAX_TOP_N_TOKENS
) -> pb.Batch:
    bs = limits.block_size
    requests = []
    remaining = limits.max_batch_prefill_tokens
    while remaining > 0:
        length = min(limits.max_input_tokens, remaining)
        remaining -= length
        max_new = limits.max_total_tokens - length
        positions = length + max_new
        blocks = list(range(limits.blocks_for(positions)))
        requests.append(
            pb.Request(
                id=len(requests),
                # Any in-vocabulary ids do; varying them avoids degenerate attention patterns.
                input_ids=[(7 * p + 3) % max(vocab_size, 1) for p in range(length)],
                parameters=pb.NextTokenChooserParameters(
                    # Every sampling feature on: warmup must cost as much as the worst request.
                    temperature=0.9,
                    top_k=10,
                    top_p=0.9,
                    typical_p=0.9,
                    do_sample=True,
                    seed=0,
                    repetition_penalty=1.2,
                    frequency_penalty=0.1,
                    presence_penalty=0.1,
                    # The most tokens a request may bias (router/api/openai.py).
                    logit_bias={t % max(vocab_size, 1): 0.5 for t in range(MAX_LOGIT_BIAS_TOKENS)},
                ),
                stopping_parameters=pb.StoppingCriteriaParameters(
                    max_new_tokens=max_new, ignore_eos_token=True
                ),
                prefill_logprobs=True,
                top_n_tokens=top_n_tokens,
                blocks=blocks,
                slots=slots_of(blocks, positions, bs),
            )
        )
    return pb.Batch(
        id=0,
        requests=requests,
        size=len(requests),
        max_tokens=sum(len(r.input_ids) + r.stopping_parameters.max_new_tokens for r in requests),
        max_blocks=max(len(r.blocks) for r in requests),
    )


def _requested_cache_tokens(args: RouterArgs, limits: Limits) -> int:
    """0 lets the shards fill their memory; a user budget also needs the reserved blocks."""
    if not args.max_batch_total_tokens:
        return 0
    return args.max_batch_total_tokens + RESERVED_BLOCKS * limits.block_size


async def warm_up(client: ShardClient, args: RouterArgs, info: pb.InfoResponse) -> Limits:
    """Resolves the limits, runs Warmup, and returns limits that fit the shards' cache.

    Raises ConfigError (naming the flag to change) when they cannot fit.
    """
    limits = resolve_limits(args, info.max_position_embeddings, info.block_size, info.device_type)
    batch = build_warmup_batch(limits, info.vocab_size, args.max_top_n_tokens)
    log.info(
        "warming up with %d request(s), %d prefill tokens",
        batch.size,
        limits.max_batch_prefill_tokens,
    )
    answer = await client.warmup(
        pb.WarmupRequest(
            batch=batch,
            max_input_tokens=limits.max_input_tokens,
            max_total_tokens=limits.max_total_tokens,
            max_prefill_tokens=limits.max_batch_prefill_tokens,
            max_batch_total_tokens=_requested_cache_tokens(args, limits),
            max_batch_size=args.max_batch_size or 0,
        )
    )
    # The warmup batch is gone from the shards' point of view only once cleared.
    await client.clear_cache()
    fitted = apply_capacity(limits, answer.max_supported_total_tokens, answer.num_blocks)
    fitted = replace(fitted, shard_max_batch_size=answer.max_batch_size)
    log.info(
        "KV cache: %d blocks of %d tokens; max_input_tokens=%d max_total_tokens=%d "
        "max_batch_prefill_tokens=%d max_batch_total_tokens=%d",
        fitted.num_blocks,
        fitted.block_size,
        fitted.max_input_tokens,
        fitted.max_total_tokens,
        fitted.max_batch_prefill_tokens,
        fitted.batch_total_tokens,
    )
    return fitted
