"""PEFT adapters for tests, made by the `peft` library itself on tiny local base models."""

from __future__ import annotations

from pathlib import Path

import torch

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name -> LoraConfig arguments: different ranks, target sets, rslora.
ADAPTERS = {
    "qv_r4": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "all_r8": dict(r=8, lora_alpha=16, target_modules=ALL),
    "mlp_rslora_r16": dict(
        r=16, lora_alpha=8, use_rslora=True, target_modules=["o_proj", "gate_proj", "down_proj"]
    ),
    "kup_r8": dict(r=8, lora_alpha=32, target_modules=["k_proj", "up_proj"]),
}

# Phi-3's checkpoints fuse q/k/v into qkv_proj and gate/up into gate_up_proj, and PEFT targets
# those modules themselves: one A per fused module, B split like its rows. The target sets: all
# linears (with per-module ranks and alphas on the fused ones), each fused module alone, and the
# row layers alone.
PHI3_ALL = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
PHI3_ADAPTERS = {
    "fused_all_r8": dict(
        r=8,
        lora_alpha=16,
        target_modules=PHI3_ALL,
        rank_pattern={"layers.1.self_attn.qkv_proj": 4},
        alpha_pattern={"gate_up_proj": 40},
    ),
    "qkv_r4": dict(r=4, lora_alpha=8, target_modules=["qkv_proj"]),
    "gate_up_rslora_r16": dict(
        r=16, lora_alpha=8, use_rslora=True, target_modules=["gate_up_proj"]
    ),
    "o_down_r8": dict(r=8, lora_alpha=32, target_modules=["o_proj", "down_proj"]),
}

# Configs beyond one r and one lora_alpha, as PEFT writes them: per-module ranks and alphas
# (keys are regexes matched at the end of a module's name) and a subset of the layers.
PATTERNED = {
    "patterns_r8": dict(
        r=8,
        lora_alpha=16,
        target_modules=ALL,
        rank_pattern={"q_proj": 4, "layers.1.mlp.down_proj": 16},
        alpha_pattern={"v_proj": 40, "gate_proj|up_proj": 3},
    ),
    "layer1_rslora": dict(
        r=4,
        lora_alpha=8,
        use_rslora=True,
        target_modules=ALL,
        layers_to_transform=[1],
        rank_pattern={"o_proj": 2},
    ),
}


def make_adapter(base_dir: Path, out_dir: Path, seed: int, **config) -> Path:
    """A PEFT adapter with random, non-zero A and B (PEFT starts B at zero), saved by PEFT."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(init_lora_weights=False, **config))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:  # small enough to keep the model sane, large enough to matter
                param.copy_(torch.randn_like(param) * 0.2)
    model.save_pretrained(out_dir)
    return out_dir


def make_adapters(base_dir: Path, root: Path, names: list[str], first_seed: int) -> dict[str, Path]:
    """The ADAPTERS named, each under root / name, seeds first_seed, first_seed + 1, ..."""
    return {
        name: make_adapter(base_dir, root / name, seed=first_seed + i, **ADAPTERS[name])
        for i, name in enumerate(names)
    }


def peft_reference(base_dir: Path, adapter_dir: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).eval()
