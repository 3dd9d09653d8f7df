"""A random-weight model with the shape of SmolLM2-135M, in bfloat16, for the benchmarks.

    .venv/bin/python -m bench.build_smollm_shape [--out DIR]     # prints the model directory

Weights and config come from `launcher.tiny_models.build_model`. Its tokenizer is trained on a
tiny corpus (~640 entries), so ~99% of the ids a random 49152-way model emits would decode to
nothing: servers would stream empty text (or skip the token), and detokenization, chunk counts
and ITL would not look like a real model's. So the tokenizer is replaced by a byte-level BPE
trained on a synthetic corpus of pseudo-words until it has exactly `vocab_size` entries, like
SmolLM2's 49152: every id the model can emit decodes to text. Deterministic (seeded).
"""

from __future__ import annotations

import argparse
import os
import random
from functools import partial
from pathlib import Path
from typing import Any

from launcher.cache_build import build_once

# Bump whenever the shape or the tokenizer recipe changes, so a stale cached build is never used.
NAME = "bench-smollm2-135m-shape-v1"
SHAPE: dict[str, Any] = {
    "architecture": "LlamaForCausalLM",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "dtype": "bfloat16",
    "seed": 0,
}


def default_dir(name: str = NAME) -> Path:
    # Same cache root as the launcher's default model (SWITCHYARD_CACHE, else ~/.cache/switchyard).
    root = os.environ.get("SWITCHYARD_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "switchyard"
    return base / name


def _pseudo_word_corpus(seed: int, lines: int = 20000, words_per_line: int = 20) -> list[str]:
    """Lines of pronounceable pseudo-words: enough distinct pairs for ~49k BPE merges."""
    rng = random.Random(seed)
    cons, vows = "bcdfghjklmnprstvwz", "aeiou"
    syllables = [c + v for c in cons for v in vows] + [v + c for c in cons for v in vows]
    syllables += [c + v + e for c in cons[:8] for v in vows for e in "nrst"]
    lexicon = [
        "".join(rng.choice(syllables) for _ in range(rng.randint(1, 5))) for _ in range(60000)
    ]
    return [" ".join(rng.choice(lexicon) for _ in range(words_per_line)) for _ in range(lines)]


def build_full_vocab_tokenizer(vocab_size: int, seed: int = 0):
    """Byte-level BPE with exactly `vocab_size` entries and tiny_models' special tokens."""
    from launcher.tiny_models import build_tokenizer

    fast = build_tokenizer(vocab_size, _pseudo_word_corpus(seed))
    if len(fast) != vocab_size:
        raise RuntimeError(f"tokenizer has {len(fast)} entries, wanted {vocab_size}")
    return fast


def build(target: Path, shape: dict[str, Any] = SHAPE) -> Path:
    """Builds the model of `shape` (build_model's arguments) into `target` (once, atomically;
    an existing build is reused)."""
    return build_once(target, partial(_build_into, shape=shape))


def _build_into(tmp: Path, shape: dict[str, Any]) -> None:
    from launcher.tiny_models import build_model

    build_model(tmp, **shape)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (tmp / name).unlink(missing_ok=True)
    tokenizer = build_full_vocab_tokenizer(shape["vocab_size"], shape["seed"])
    tokenizer.save_pretrained(tmp)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help=f"default: {default_dir()}")
    args = parser.parse_args(argv)
    print(build(args.out or default_dir()))


if __name__ == "__main__":
    main()
