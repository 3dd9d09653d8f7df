"""Random-weight bf16 models and their AWQ GEMM twins, packed by AutoAWQ, for bench/quant_decode.

Run with the quantization tool venv's python (AutoAWQ is not, and must not be, in .venv; see
tests/quant_fixtures/README.md for how /tmp/qtools was made):

    /tmp/qtools/bin/python bench/build_quantized.py                      # both shapes
    /tmp/qtools/bin/python bench/build_quantized.py --shapes smollm --out DIR

Prints one line per shape: `SHAPE BF16_DIR AWQ_DIR`. Outputs are cached under
~/.cache/switchyard/bench/ (or $SWITCHYARD_CACHE/bench, or --out) and reused; never commit them.

Shapes:
- `smollm`: the SmolLM2-135M shape of bench/build_smollm_shape.py (its own cached build recipe,
  vocab-sized tokenizer included). AWQ group size 64: its hidden size 576 is 4.5 groups of 128,
  which AutoAWQ refuses (q/k/v/gate/up take 576 inputs); 64 divides every input size.
- `llama1b`: a ~1.1B Llama (hidden 2048, intermediate 8192, 16 layers, 32 heads, 8 KV heads,
  vocab 32000, untied lm_head; the Llama-3.2-1B body with a Llama-2 vocabulary), from
  launcher/tiny_models.build_model. AWQ group size 128.

Weights are launcher/tiny_models' normal init (std 0.05, embeddings and lm_head 0.08): random,
but with finite, non-degenerate activations through every layer, which is all a speed
benchmark needs. The float model is saved in bfloat16.

AWQ: round-to-nearest with AutoAWQ's own code, no activation-aware search (it needs calibration
data and changes no tensor shape, hence no speed). Per linear, exactly what AutoAWQ's
`AwqQuantizer._apply_quant` does after its search: the weight in fp16,
`AwqQuantizer.pseudo_quantize_tensor` (per-group min/max scales and integer zeros, zero_point
on), then `WQLinear_GEMM.from_linear` packs qweight/qzeros/scales. Every other tensor is saved
in fp16 and config.json gets AutoAWQ's `quantization_config`, as `save_quantized` writes them.
The lm_head and embeddings stay unquantized, as in AutoAWQ.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Run as a script: bench/ is first on sys.path, where bench/shard.py would shadow the shard
# package, and the repository root (launcher, bench) is not on it at all.
if sys.path and Path(sys.path[0]).resolve() == REPO / "bench":
    sys.path[0] = str(REPO)

# Bump when a shape or the quantization recipe changes: a stale cached build is never reused.
VERSION = "v1"
LLAMA_1B: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "dtype": "bfloat16",
    "seed": 0,
}
GROUP_SIZE = {"smollm": 64, "llama1b": 128}
QUANT_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def default_root() -> Path:
    root = os.environ.get("SWITCHYARD_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "switchyard"
    return base / "bench"


def model_dirs(root: Path, shape: str) -> tuple[Path, Path]:
    """(bf16 dir, AWQ dir) of a shape under `root`: also what bench/quant_decode.py looks for."""
    g = GROUP_SIZE[shape]
    return root / f"{shape}-{VERSION}-bf16", root / f"{shape}-{VERSION}-awq-g{g}"


def _atomic_build(target: Path, fill) -> Path:
    """Builds beside `target` and renames into place: an interrupted build is never reused."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        fill(tmp)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def build_bf16(shape: str, target: Path) -> Path:
    if shape == "smollm":
        from bench.build_smollm_shape import build

        return build(target)

    def fill(tmp: Path) -> None:
        from launcher.tiny_models import build_model

        build_model(tmp, "LlamaForCausalLM", **LLAMA_1B)

    return _atomic_build(target, fill)


def awq_pack(weight, group_size: int) -> dict[str, Any]:
    """qweight/qzeros/scales of one [out, in] weight, by AutoAWQ's own functions."""
    import torch
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.quantize.quantizer import AwqQuantizer

    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=torch.float16)
    linear.weight.data = weight.to(torch.float16)
    # pseudo_quantize_tensor reads only these three attributes of its quantizer; a full
    # AwqQuantizer would want the model, a tokenizer and calibration data.
    quantizer = types.SimpleNamespace(w_bit=4, group_size=group_size, zero_point=True)
    linear.weight.data, scales, zeros = AwqQuantizer.pseudo_quantize_tensor(
        quantizer, linear.weight.data
    )
    q = WQLinear_GEMM.from_linear(
        linear, 4, group_size, scales=scales.t().contiguous(), zeros=zeros.t().contiguous()
    )
    return {"qweight": q.qweight, "qzeros": q.qzeros, "scales": q.scales}


def build_awq(bf16_dir: Path, target: Path, group_size: int) -> Path:
    def fill(tmp: Path) -> None:
        import torch
        from safetensors import safe_open
        from safetensors.torch import save_file

        out: dict[str, torch.Tensor] = {}
        files = sorted(bf16_dir.glob("*.safetensors"))
        t0 = time.monotonic()
        for path in files:
            with safe_open(path, "pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    tensor = f.get_tensor(name)
                    prefix, leaf = name.rsplit(".", 1)
                    if leaf == "weight" and prefix.endswith(QUANT_SUFFIXES):
                        for key, value in awq_pack(tensor, group_size).items():
                            out[f"{prefix}.{key}"] = value.contiguous()
                        print(f"  {prefix} ({time.monotonic() - t0:.0f} s)", flush=True)
                    else:
                        out[name] = tensor.to(torch.float16).contiguous()
        save_file(out, tmp / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((bf16_dir / "config.json").read_text())
        config["dtype"] = "float16"
        config["quantization_config"] = {
            "bits": 4,
            "group_size": group_size,
            "modules_to_not_convert": None,
            "quant_method": "awq",
            "version": "gemm",
            "zero_point": True,
        }
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for side in bf16_dir.iterdir():
            if side.suffix != ".safetensors" and side.name != "config.json" and side.is_file():
                shutil.copy(side, tmp / side.name)
        (tmp / "provenance.json").write_text(json.dumps(provenance(bf16_dir, group_size), indent=2))

    return _atomic_build(target, fill)


def provenance(bf16_dir: Path, group_size: int) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "source": str(bf16_dir),
        "tool": {"name": "autoawq", "version": version("autoawq")},
        "function": "per linear: fp16 weight -> awq.quantize.quantizer.AwqQuantizer."
        "pseudo_quantize_tensor (w_bit 4, zero_point, RTN, no search) -> "
        "awq.modules.linear.gemm.WQLinear_GEMM.from_linear(scales.T, zeros.T)",
        "group_size": group_size,
        "versions": {n: version(n) for n in ("torch", "transformers", "safetensors")},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", choices=sorted(GROUP_SIZE), default=["smollm", "llama1b"])
    p.add_argument("--out", type=Path, default=None, help=f"default: {default_root()}")
    args = p.parse_args(argv)
    root = args.out or default_root()
    for shape in args.shapes:
        bf16, awq = model_dirs(root, shape)
        build_bf16(shape, bf16)
        build_awq(bf16, awq, GROUP_SIZE[shape])
        print(shape, bf16, awq, flush=True)


if __name__ == "__main__":
    main()
