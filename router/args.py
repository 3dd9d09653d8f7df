"""The router's command line (the contract with the launcher is in docs/architecture.md).

Token limits stay `None` when unset: their defaults depend on the model's context length, which
only the shards know, so `router.limits` resolves them after the Info RPC.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


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
    served_model_name: str | None = None

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
    p.add_argument("--served-model-name", default=None)
    return p


def parse_args(argv: list[str] | None = None) -> RouterArgs:
    ns = build_parser().parse_args(argv)
    values = vars(ns)
    if values["max_batch_total_tokens"] == 0:
        values["max_batch_total_tokens"] = None
    return RouterArgs(**values)
