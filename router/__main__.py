"""`python -m router --model-id DIR --shard-uds-path P [...]` (flags: docs/architecture.md)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from router.args import RouterArgs, parse_args
from router.client import ShardClient, ShardError
from router.infer import Infer, model_info
from router.limits import ConfigError
from router.model_fit import fit_to_model
from router.server import create_app, serve
from router.tokenizer import Tokenizer
from router.warmup import warm_up

log = logging.getLogger("router")

# The shards could no longer serve (a step past --shard-step-timeout, a shard that stopped).
EXIT_SHARDS_LOST = 4


async def build_infer(args: RouterArgs) -> Infer:
    """Tokenizer, shard connection, Info, Warmup: everything before the first request."""
    tokenizer = Tokenizer.from_dir(args.model_id)
    client = await ShardClient.connect(args.shard_uds_path, args.shard_connect_timeout)
    try:
        info = await client.info()
        check_draft_model(args, info)
        limits = await warm_up(client, args, info)
        args = fit_to_model(args, info.recurrent_state, limits)
    except BaseException:
        await client.close()
        raise
    return Infer(args, limits, model_info(info, args.model_name), client, tokenizer)


def check_draft_model(args: RouterArgs, info) -> None:
    """Speculation with a draft model needs shards that hold one (the launcher starts them so)."""
    config = args.speculative_config
    if config is not None and config.method == "draft_model" and not info.draft_model_id:
        raise ConfigError(
            f"--speculative-config: method 'draft_model' ({config.model}), but the shards hold no "
            "draft model (start them with --draft-model; the launcher does)"
        )


class ShardsLostExit(Exception):
    """The router stopped because the shards could no longer serve (router/infer.py)."""


async def amain(args: RouterArgs) -> None:
    infer = await build_infer(args)
    try:
        failure = await serve(create_app(infer), args.hostname, args.port)
        if failure is not None:
            raise ShardsLostExit(failure)
    finally:
        await infer.client.close()
        infer.tokenizer.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = parse_args(argv)
    try:
        asyncio.run(amain(args))
    except ConfigError as err:
        print(f"router: error: {err}", file=sys.stderr)
        return 2
    except (ShardError, TimeoutError, asyncio.TimeoutError) as err:
        print(
            f"router: error: cannot start with the shards at {args.shard_uds_path}: {err}",
            file=sys.stderr,
        )
        return 1
    except ShardsLostExit as err:
        # The launcher names this line when it reports the router's exit (launcher/supervisor.py).
        print(f"router: error: {err}", file=sys.stderr)
        return EXIT_SHARDS_LOST
    except KeyboardInterrupt:
        return 130
    return 0


def exit_now(code: int) -> None:
    """Exits once everything is flushed, skipping the interpreter's teardown: its final garbage
    collection alone took 2.5 s, which delays the launcher's stop (2 s goals after a failure)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
