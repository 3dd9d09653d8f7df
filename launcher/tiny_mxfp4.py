"""Rewrites a tiny gpt-oss checkpoint's experts in MXFP4, as the released gpt-oss checkpoints
store them: `experts.gate_up_proj_blocks` / `_scales` and `experts.down_proj_blocks` / `_scales`
(shard/layers/quant/mxfp4.py) in place of the floating-point `gate_up_proj` and `down_proj`,
and `quantization_config` {"quant_method": "mxfp4"} in config.json.

The codes and scales are random bytes (every byte is a valid e2m1 pair; the scales are drawn so
that the weights spread about as the float ones): the checkpoint is then what transformers'
own MXFP4 reader dequantizes, the reference the server is compared against."""

from __future__ import annotations

import json
from pathlib import Path

EXPERT_WEIGHTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
# 2^(byte - 127): 2^-7 .. 2^-5 times e2m1 values of magnitude up to 6
_SCALE_BYTES = (120, 123)
# what the released checkpoints leave in floating point
MODULES_TO_NOT_CONVERT = [
    "model.layers.*.self_attn",
    "model.layers.*.mlp.router",
    "model.embed_tokens",
    "lm_head",
]


def to_mxfp4(path: Path, seed: int = 0) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    weights_file = path / "model.safetensors"
    tensors = load_file(weights_file)
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in tensors.items():
        if not name.endswith(EXPERT_WEIGHTS):
            out[name] = tensor
            continue
        experts, inputs, outputs = tensor.shape  # transformers holds them [E, in, out]
        if inputs % 32:
            raise ValueError(f"{name}: {inputs} inputs are not whole MXFP4 blocks of 32")
        groups = inputs // 32
        out[f"{name}_blocks"] = torch.randint(
            0, 256, (experts, outputs, groups, 16), dtype=torch.uint8, generator=generator
        )
        out[f"{name}_scales"] = torch.randint(
            *_SCALE_BYTES, (experts, outputs, groups), dtype=torch.uint8, generator=generator
        )
    save_file(out, weights_file, metadata={"format": "pt"})
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": MODULES_TO_NOT_CONVERT,
    }
    config_file.write_text(json.dumps(config, indent=2))
