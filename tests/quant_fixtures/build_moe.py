# ruff: noqa: E501 - long provenance strings are kept whole
"""Builds the int4 Mixture-of-Experts fixture, gptq_g32_sym_qwen3_moe, with gptqmodel itself.

A tiny Qwen3-MoE (launcher/tiny_models.build_model, 4 experts, top 2) quantized by gptqmodel
7.7.0's own MoE support (its `qwen3_moe` definition: attention and every routed expert's
gate/up/down quantized, the router `mlp.gate` kept in fp16), saved in the Hub's per-expert layout
(`mlp.experts.{e}.gate_proj.qweight` ...). Switchyard refuses int4 experts at load, naming the
format and the module (tests/shard/test_quantized_moe.py), so this fixture has no `reference/`:
tests/shard/quant_fixtures.py serves every directory that has one. provenance.json records the
tool's own checks instead: that gptqmodel calibrated every expert, that its own forward stays
close to the float source, and that its expert tensors unpack by the same GPTQ layout as the
dense fixtures' (README.md), exactly.

Same venv as build.py's gptq stage (its docstring has the install commands). From the repo root:

  GPTQMODEL_CPU_WORKERS=2 /tmp/qtools/bin/python tests/quant_fixtures/build_moe.py   # ~20 s
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import build  # noqa: E402 - the dense fixtures' helpers, next to this file

NAME = "gptq_g32_sym_qwen3_moe"
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True)
SPEC = dict(
    tool="gptq",
    arch="Qwen3MoeForCausalLM",
    tie=False,
    seed=111,
    bits=4,
    group_size=32,
    desc_act=False,
    sym=True,
    format="gptq",
    config=MOE,
)


def quantize(work: Path) -> Path:
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig

    fx = HERE / NAME
    if fx.exists():
        shutil.rmtree(fx)
    float_dir = build.build_float(SPEC, work / "float")
    # As build.py: gptqmodel's tokenizer helper gets a copy whose pad token is '<unk>' (id 0).
    tool_dir = work / "float_for_tool"
    shutil.copytree(float_dir, tool_dir)
    tcfg = json.loads((tool_dir / "tokenizer_config.json").read_text())
    tcfg["pad_token"] = "<unk>"
    (tool_dir / "tokenizer_config.json").write_text(json.dumps(tcfg))
    qc = QuantizeConfig(
        bits=SPEC["bits"],
        group_size=SPEC["group_size"],
        desc_act=SPEC["desc_act"],
        sym=SPEC["sym"],
        format=SPEC["format"],
        act_group_aware=False,
        offload_to_disk=False,
    )
    model = GPTQModel.load(str(tool_dir), qc, dtype=torch.float16)
    ids = build.calib_ids(float_dir)
    model.quantize([{"input_ids": i, "attention_mask": [1] * len(i)} for i in ids], batch_size=1)
    model.save(str(fx))
    del model
    build.finish_quant_dir(fx, float_dir)
    return float_dir


def checks(fx: Path, float_dir: Path) -> list[dict]:
    import torch
    from gptqmodel import BACKEND, GPTQModel
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    found = []
    sd = load_file(fx / "model.safetensors")
    experts = sorted(k for k in sd if ".mlp.experts." in k and k.endswith(".qweight"))
    router = sorted(k for k in sd if k.endswith(".mlp.gate.weight"))
    with open(fx / "quant_log.csv") as f:
        samples = {(r["layer"], r["module"]): int(r["samples"]) for r in csv.DictReader(f)}
    expert_samples = {k: v for k, v in samples.items() if ".experts." in k[1]}
    assert len(experts) == 2 * MOE["num_experts"] * 3, experts
    assert min(expert_samples.values()) > 0, expert_samples
    found.append(
        dict(
            check="what gptqmodel quantized",
            quantized_expert_modules=len(experts),
            router=f"{router} kept as {sd[router[0]].dtype}",
            calibration_tokens_per_expert_module=dict(
                min=min(expert_samples.values()), max=max(expert_samples.values())
            ),
        )
    )

    # gptqmodel's own dequantization of every quantized module, and its own forward.
    qm = GPTQModel.load(str(fx), backend=BACKEND.GPTQ_TORCH, device="cpu", dtype=torch.float16)
    dequant, tool_logits = {}, []
    with torch.no_grad():
        for mname, mod in qm.model.named_modules():
            if isinstance(mod, BaseQuantLinear):
                scales = mod.scales
                mod.scales = scales.float()
                dequant[mname] = mod.dequantize_weight().t().float()  # (out, in)
                mod.scales = scales
        for ids in build.LOGIT_PROBE:
            tool_logits.append(qm.model(torch.tensor([ids])).logits[0].float())
    del qm
    # The README's GPTQ layout, in plain torch, on every expert and attention module.
    worst, n = 0.0, 32 // SPEC["bits"]
    for key in (k for k in sd if k.endswith(".qweight")):
        p = key.rsplit(".", 1)[0]
        iw = build._fields(sd[p + ".qweight"], SPEC["bits"], n).permute(0, 2, 1).flatten(0, 1)
        iz = build._fields(sd[p + ".qzeros"], SPEC["bits"], n).flatten(1)
        gi = sd[p + ".g_idx"].long()
        w = ((iw - (iz[gi] + 1)) * sd[p + ".scales"].float()[gi]).t()
        worst = max(worst, (w - dequant[p]).abs().max().item())
    assert worst == 0.0, worst
    found.append(
        dict(
            check="README.md's GPTQ (v1) layout unpacked in plain torch == gptqmodel dequantize_weight()",
            modules=len(dequant),
            max_abs_diff=worst,
        )
    )

    source = AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        float_logits = [source(torch.tensor([ids])).logits[0] for ids in build.LOGIT_PROBE]
    diff = max((a - b).abs().max().item() for a, b in zip(float_logits, tool_logits, strict=True))
    same = sum(
        int((a.argmax(-1) == b.argmax(-1)).sum())
        for a, b in zip(float_logits, tool_logits, strict=True)
    )
    found.append(
        dict(
            check="gptqmodel GPTQModel.load(backend=gptq_torch) fp16 forward vs the float32 source (expect a small nonzero gap)",
            max_abs_logit_diff=diff,
            max_abs_logit=max(a.abs().max().item() for a in float_logits),
            argmax_equal_positions=f"{same}/{sum(len(ids) for ids in build.LOGIT_PROBE)}",
        )
    )
    try:  # transformers + optimum + gptqmodel's kernels: another reader of the same file
        other = build.transformers_on_quant_dir(fx)
        found.append(
            dict(
                check="transformers AutoModelForCausalLM fp32 on the quantized dir vs gptqmodel's own forward",
                max_abs_logit_diff=max(
                    (a - b.float()).abs().max().item()
                    for a, b in zip(tool_logits, other, strict=True)
                ),
            )
        )
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        found.append(
            dict(
                check="transformers AutoModelForCausalLM on the quantized dir", error=repr(e)[:500]
            )
        )
    for c in found:
        print(" ", c)
    return found


def main() -> None:
    import gptqmodel

    work = Path(tempfile.mkdtemp(prefix="quant_moe_"))
    os.chdir(work)  # gptqmodel writes its logs/ under the working directory: not in the repo
    try:
        float_dir = quantize(work)
        fx = HERE / NAME
        prov = build.base_provenance(NAME, SPEC)
        prov.update(
            tool=dict(name="gptqmodel", version=gptqmodel.__version__),
            function="gptqmodel.GPTQModel.load(float_dir, QuantizeConfig(...), dtype=float16) -> .quantize(calib) -> .save() "
            "(gptqmodel/models/definitions/qwen3_moe.py: q/k/v/o_proj and every mlp.experts.{e}.gate/up/down_proj; mlp.gate not quantized)",
            parameters=dict(
                bits=SPEC["bits"],
                group_size=SPEC["group_size"],
                desc_act=SPEC["desc_act"],
                sym=SPEC["sym"],
                checkpoint_format=SPEC["format"],
                act_group_aware=False,
                pack_dtype="int32",
                lm_head_quantized=False,
            ),
            versions=build._versions("gptqmodel", "optimum", "defuser"),
            notes=[
                "No reference/: Switchyard refuses int4 experts at load (shard/layers/moe.py _refuse_quantized), "
                "and tests/shard/quant_fixtures.py serves every fixture that has a reference/.",
                "gptqmodel 7.7.0 requires torch>=2.14.1 on paper; installed with --no-deps on torch 2.13.0+cpu and ran on CPU.",
            ],
            checks=checks(fx, float_dir),
        )
        build.write_provenance(fx, prov)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
