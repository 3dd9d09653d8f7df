"""The router's command line (the contract with the launcher is in docs/architecture.md).

Token limits stay `None` when unset: their defaults depend on the model's context length, which
only the shards know, so `router.limits` resolves them after the Info RPC.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from router.adapters import AdapterSpecError, LoraAdapter, parse_adapters

# The launcher hands the API key over in the environment, not on a command line that `ps` and
# the launcher's own log would show.
API_KEY_ENV = "SWITCHYARD_API_KEY"
# TGI's default: bodies are small JSON documents; the token limits are the real bound on prompts.
DEFAULT_PAYLOAD_LIMIT = 2_000_000
# Distinct LoRA adapters the shards hold on the device at once (the launcher's default too).
DEFAULT_MAX_LORAS = 4


@dataclass(frozen=True)
class RouterArgs:
    model_id: str
    shard_uds_path: str
    hostname: str = "0.0.0.0"
    port: int = 3000
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int | None = None
    max_batch_total_tokens: int | None = None
    max_concurrent_requests: int = 128
    max_stop_sequences: int = 4
    max_best_of: int = 2
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20
    max_batch_size: int | None = None
    prefill_chunking: bool = True
    prefill_chunk_tokens: int | None = None
    # Automatic prefix caching (router/prefix_cache.py).
    prefix_caching: bool = True
    max_top_n_tokens: int = 5
    payload_limit: int = DEFAULT_PAYLOAD_LIMIT
    api_key: str | None = None
    cors_allow_origin: tuple[str, ...] = field(default_factory=tuple)
    served_model_name: str | None = None
    lora_adapters: tuple[LoraAdapter, ...] = ()
    max_loras: int = DEFAULT_MAX_LORAS
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter; paths only under lora_dir.
    enable_lora_runtime_loading: bool = False
    lora_dir: str | None = None  # a real path (symlinks resolved)

    @property
    def model_name(self) -> str:
        """The name /info reports: the served name when given, else the model directory."""
        return self.served_model_name or self.model_id


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0.0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m router",
        description="Switchyard router: HTTP API, validation, batching and KV blocks.",
    )
    p.add_argument("--model-id", required=True, help="local model directory (tokenizer source)")
    p.add_argument("--shard-uds-path", required=True, help="shard r listens on unix://{P}-{r}")
    p.add_argument("--hostname", default="0.0.0.0")
    p.add_argument("--port", type=_positive_int, default=3000)
    p.add_argument("--max-input-tokens", type=_positive_int, default=None)
    p.add_argument("--max-total-tokens", type=_positive_int, default=None)
    p.add_argument("--max-batch-prefill-tokens", type=_positive_int, default=None)
    # 0 means unset, so the launcher can always forward the flag.
    p.add_argument("--max-batch-total-tokens", type=_non_negative_int, default=None)
    p.add_argument("--max-concurrent-requests", type=_positive_int, default=128)
    p.add_argument("--max-stop-sequences", type=_non_negative_int, default=4)
    p.add_argument("--max-best-of", type=_positive_int, default=2)
    p.add_argument("--waiting-served-ratio", type=_non_negative_float, default=0.3)
    p.add_argument("--max-waiting-tokens", type=_non_negative_int, default=20)
    p.add_argument(
        "--max-batch-size", type=_positive_int, default=None, help="requests per batch (unbounded)"
    )
    p.add_argument(
        "--prefill-chunking",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compute prompts over several steps, mixed into the decoding of running requests "
        "(default: on)",
    )
    p.add_argument(
        "--prefill-chunk-tokens",
        type=_positive_int,
        default=None,
        help="with chunking, prompt tokens a step may add while requests are decoding, grown "
        "up to 4x when many prompt tokens wait (default: 64 on CPU, --max-batch-prefill-tokens "
        "on GPU)",
    )
    p.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the KV blocks of computed prompts and reuse them for later requests that "
        "start with the same tokens (default: on)",
    )
    p.add_argument("--max-top-n-tokens", type=_non_negative_int, default=5)
    p.add_argument(
        "--payload-limit", type=_positive_int, default=DEFAULT_PAYLOAD_LIMIT, help="bytes"
    )
    p.add_argument(
        "--api-key",
        default=None,
        help=f"require `Authorization: Bearer KEY` on generation routes (or set {API_KEY_ENV})",
    )
    p.add_argument(
        "--cors-allow-origin",
        action="append",
        default=None,
        help="origin allowed to call the API from a browser (repeatable, or comma-separated; "
        "'*' for any)",
    )
    p.add_argument("--served-model-name", default=None)
    p.add_argument(
        "--lora-adapters",
        action="append",
        default=None,
        metavar="NAME=DIR[,NAME=DIR...]",
        help="LoRA adapters the shards loaded (repeatable, or comma-separated)",
    )
    p.add_argument(
        "--max-loras",
        type=_positive_int,
        default=DEFAULT_MAX_LORAS,
        help="distinct adapters among the requests on the shards at once (their device slots)",
    )
    p.add_argument(
        "--enable-lora-runtime-loading",
        action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (needs --lora-dir; "
        "the shards must run with --enable-lora)",
    )
    p.add_argument(
        "--lora-dir",
        default=None,
        metavar="DIR",
        help="the only directory runtime-loaded adapters may come from (its subdirectories)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> RouterArgs:
    parser = build_parser()
    ns = parser.parse_args(argv)
    values = vars(ns)
    model_name = values["served_model_name"] or values["model_id"]
    try:
        values["lora_adapters"] = parse_adapters(values["lora_adapters"] or (), model_name)
    except AdapterSpecError as err:
        parser.error(f"argument --lora-adapters: {err}")
    if values["lora_dir"] is not None:
        if not os.path.isdir(values["lora_dir"]):
            parser.error(f"argument --lora-dir: {values['lora_dir']} is not a directory")
        values["lora_dir"] = os.path.realpath(values["lora_dir"])
    if values["enable_lora_runtime_loading"] and values["lora_dir"] is None:
        # Without it any file of the host could be handed to the shards to read.
        parser.error("--enable-lora-runtime-loading needs --lora-dir DIR (where adapters may be)")
    if values["max_batch_total_tokens"] == 0:
        values["max_batch_total_tokens"] = None
    if values["api_key"] is None:
        values["api_key"] = os.environ.get(API_KEY_ENV) or None
    origins = [o.strip() for arg in values["cors_allow_origin"] or [] for o in arg.split(",")]
    values["cors_allow_origin"] = tuple(o for o in origins if o)
    return RouterArgs(**values)
