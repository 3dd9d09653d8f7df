"""PEFT LoRA adapters for the multi-LoRA serving benchmark, made by `peft` itself, cached.

    .venv/bin/python -m bench.lora_adapters [--count 16] [--rank 16]   # prints the directory

One PeftModel is built on the base model once; for each adapter its LoRA tensors are redrawn
from a per-adapter seed and saved with `save_pretrained`, so every adapter is a genuine PEFT
directory (adapter_config.json + adapter_model.safetensors) with different weights. PEFT starts
B at zero, which would make every adapter a no-op on the base model's numbers; A and B are drawn
like an `nn.Linear` of their shape (uniform, bound 1/sqrt(fan_in)) instead, what
`init_lora_weights=False` gives, so the adapted model stays sane and really differs per adapter.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

# Every projection the shards can adapt: the issue asks for "all modules".
ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Bump when the recipe changes, so a stale cached set is never reused.
VERSION = "v1"


def adapter_names(count: int) -> list[str]:
    return [f"lora{i:02d}" for i in range(count)]


def default_root(model_dir: Path, rank: int) -> Path:
    # Beside the other bench builds (SWITCHYARD_CACHE, else ~/.cache/switchyard), per base model.
    root = os.environ.get("SWITCHYARD_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "switchyard"
    return base / "bench" / f"lora-{model_dir.name}-r{rank}-{VERSION}"


def _complete(root: Path, names: list[str]) -> bool:
    return all((root / n / "adapter_config.json").is_file() for n in names)


def build_adapters(
    model_dir: Path, root: Path, count: int, rank: int = 16, alpha: int = 32, seed: int = 0
) -> dict[str, Path]:
    """name -> adapter directory, `count` adapters under `root` (built once, then reused)."""
    names = adapter_names(count)
    if _complete(root, names):
        return {n: root / n for n in names}

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root.mkdir(parents=True, exist_ok=True)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(ALL_MODULES), init_lora_weights=False
    )
    model = get_peft_model(base, config)
    lora_params = [(n, p) for n, p in model.named_parameters() if "lora_" in n]
    out: dict[str, Path] = {}
    for i, name in enumerate(names):
        target = root / name
        if not (target / "adapter_config.json").is_file():
            generator = torch.Generator().manual_seed(seed * 1000 + i)
            with torch.no_grad():
                for _, param in lora_params:
                    bound = 1 / math.sqrt(param.shape[1])  # weight [out, in]: nn.Linear's init
                    param.copy_((torch.rand(param.shape, generator=generator) * 2 - 1) * bound)
            # Saved beside the target and renamed into place: a half-written one is never reused.
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
            try:
                model.save_pretrained(tmp)
                os.rename(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        out[name] = target
    return out


def describe(adapter_dir: Path) -> dict[str, object]:
    """What the benchmark records about an adapter: rank, alpha, targets (from its config)."""
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    return {
        "r": cfg["r"],
        "lora_alpha": cfg["lora_alpha"],
        "target_modules": sorted(cfg["target_modules"]),
    }


def main(argv: list[str] | None = None) -> None:
    from bench.build_smollm_shape import build, default_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=None, help="default: the SmolLM2 shape")
    p.add_argument("--count", type=int, default=16)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=int, default=32)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    model_dir = args.model_dir or build(default_dir())
    root = args.out or default_root(model_dir, args.rank)
    build_adapters(model_dir, root, args.count, args.rank, args.alpha)
    print(root)


if __name__ == "__main__":
    main()
