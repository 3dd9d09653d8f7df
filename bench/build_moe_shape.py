"""A random-weight Qwen3-MoE of ~180M parameters (16 experts, top-2, ~50M active), in bfloat16,
for the CPU serving benchmark of Mixture-of-Experts models:

    .venv/bin/python -m bench.build_moe_shape [--out DIR]     # prints the model directory
    .venv/bin/python -m bench.serve --model-dir "$(...)" --ignore-eos --concurrency 16

Built as bench/build_smollm_shape.py builds the SmolLM2-shaped model (transformers' own class
with random weights, a tokenizer whose every id decodes to text); the router's weights spread
wider than the rest (launcher.tiny_models), so tokens spread over the experts.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.build_smollm_shape import build, default_dir

NAME = "bench-qwen3-moe-16x2-shape-v1"
SHAPE: dict[str, Any] = {
    "architecture": "Qwen3MoeForCausalLM",
    "vocab_size": 49152,
    "hidden_size": 512,
    "intermediate_size": 1536,  # unused: every layer is sparse
    "moe_intermediate_size": 768,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "dtype": "bfloat16",
    "seed": 0,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help=f"default: {default_dir(NAME)}")
    args = parser.parse_args(argv)
    print(build(args.out or default_dir(NAME), SHAPE))


if __name__ == "__main__":
    main()
