"""`--speculate N` and `--speculative-config JSON` on a command line (the router's and the
launcher's, which forwards them): argparse types, so a bad value is argparse's usual one-line
error naming the flag (exit 2), never a traceback."""

from __future__ import annotations

import argparse

from router.speculation.config import (
    CONFIG_FLAG,
    MAX_SPECULATIVE_TOKENS,
    SPECULATE_FLAG,
    SpeculativeConfig,
    SpeculativeConfigError,
    parse_speculative_config,
    speculate,
)


def _speculate_type(text: str) -> SpeculativeConfig:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    try:
        return speculate(value)
    except SpeculativeConfigError:
        raise argparse.ArgumentTypeError(
            f"must be between 1 and {MAX_SPECULATIVE_TOKENS} (tokens proposed per step), got {text}"
        ) from None


def _config_type(text: str) -> SpeculativeConfig:
    try:
        return parse_speculative_config(text)
    except SpeculativeConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


_speculate_type.__name__ = "speculate"  # argparse names the type in some messages
_config_type.__name__ = "speculative config"


def add_speculation_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        SPECULATE_FLAG,
        dest="speculate",
        type=_speculate_type,
        default=None,
        metavar="N",
        help="speculative decoding with n-gram (prompt lookup) proposals of up to N tokens per "
        "step (TGI's flag; the same as --speculative-config "
        '\'{"method": "ngram", "num_speculative_tokens": N}\')',
    )
    p.add_argument(
        CONFIG_FLAG,
        dest="speculative_config",
        type=_config_type,
        default=None,
        metavar="JSON",
        help="vLLM's speculative decoding settings: method 'ngram' with num_speculative_tokens "
        "(1-16), prompt_lookup_min and prompt_lookup_max (default 5), disable_by_batch_size; or "
        "method 'draft_model' with model (a smaller model with the same vocabulary), "
        "num_speculative_tokens, disable_by_batch_size",
    )


def resolve_speculation(
    parser: argparse.ArgumentParser, ns: argparse.Namespace
) -> SpeculativeConfig | None:
    """The one config the two flags give, removing both from `ns`; both at once is an error."""
    short, full = ns.speculate, ns.speculative_config
    del ns.speculate, ns.speculative_config
    if short is not None and full is not None:
        parser.error(f"{SPECULATE_FLAG} and {CONFIG_FLAG} cannot be used together (pick one)")
    return short if short is not None else full
