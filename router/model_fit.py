"""The router's flags fitted to what the shards' model can do, after Info and Warmup.

A model with linear attention (Qwen3.5) keeps a fixed state per sequence in some layers
(InfoResponse.recurrent_state). That state is not in the KV blocks, so a cached prefix cannot
restore it, and it cannot be rolled back past rejected proposals: such a model runs without
prefix caching (off by default, an error when asked for) and without speculative decoding (an
error when asked for, as vLLM refuses it). The shards hold states for a fixed number of
sequences (WarmupResponse.max_batch_size), which bounds --max-batch-size.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from router.args import RouterArgs
from router.limits import ConfigError, Limits

log = logging.getLogger(__name__)


def fit_to_model(args: RouterArgs, recurrent_state: bool, limits: Limits) -> RouterArgs:
    """`args` with the defaults the model decides filled in; ConfigError (naming the flag) for
    what it cannot do."""
    if not recurrent_state:
        caching = True if args.prefix_caching is None else args.prefix_caching
        return replace(args, prefix_caching=caching)
    if args.prefix_caching:
        raise ConfigError(
            "--prefix-caching: this model has linear-attention layers, whose per-sequence state "
            "a cached prefix cannot restore; serve it with --no-prefix-caching"
        )
    if args.speculative_config is not None:
        raise ConfigError(
            "--speculative-config: this model has linear-attention layers, whose per-sequence "
            "state cannot be rolled back past rejected proposals; serve it without speculation"
        )
    if args.prefix_caching is None:
        log.info("prefix caching off: the model has linear-attention layers")
    max_batch_size = args.max_batch_size
    slots = limits.shard_max_batch_size
    if slots and (max_batch_size is None or max_batch_size > slots):
        log.info("--max-batch-size %d: the shards hold recurrent states for that many", slots)
        max_batch_size = slots
    return replace(args, prefix_caching=False, max_batch_size=max_batch_size)
