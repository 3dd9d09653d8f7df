# ruff: noqa: E501 - long provenance strings are kept whole
"""Builds the int4 Mixture-of-Experts fixtures, gptq_g32_sym_qwen3_moe and (--float-experts)
gptq_g32_sym_qwen3_moe_float_experts, with gptqmodel itself.

A tiny Qwen3-MoE (launcher/tiny_models.build_model, 4 experts, top 2) quantized by gptqmodel
7.7.0's own MoE support (its `qwen3_moe` definition: attention and every routed expert's
gate/up/down quantized, the router `mlp.gate` kept in fp16), saved in the Hub's per-expert layout
(`mlp.experts.{e}.gate_proj.qweight` ...). Its `reference/` is written by --reference from the
checkpoint as it stands (not quantized again): gptqmodel's own dequantization of every quantized
module, experts included, as build.py's gptq stage writes the dense fixtures'. provenance.json
records the tool's checks too: that gptqmodel calibrated every expert, that its own forward stays
close to the float source, and that its expert tensors unpack by the same GPTQ layout as the
dense fixtures' (README.md), exactly. tests/shard/test_quantized_moe.py serves it.

--float-experts builds the same model with gptqmodel's common MoE recipe, the `dynamic` rule
`{"-:.*\\.experts\\..*": {}}`: attention int4, every routed expert left in fp16 (and saved so).
That checkpoint serves, so it has a `reference/` like the dense fixtures' (gptqmodel's own
dequantization of the attention modules; everything else the checkpoint's fp16 cast to fp32),
and `build.py verify` writes its expected.json. tests/shard/test_quantized_moe.py serves it.

The AWQ and compressed-tensors MoE fixtures (awq_gemm_g32_qwen3_moe, ct_w4a16_group32_asym_qwen3_moe)
are built by build_moe_awq_ct.py beside this file, from the same SPEC shape.

Same venv as build.py's gptq stage (its docstring has the install commands). From the repo root:

  GPTQMODEL_CPU_WORKERS=2 /tmp/qtools/bin/python tests/quant_fixtures/build_moe.py   # ~20 s
  GPTQMODEL_CPU_WORKERS=2 /tmp/qtools/bin/python tests/quant_fixtures/build_moe.py --reference
  GPTQMODEL_CPU_WORKERS=2 /tmp/qtools/bin/python tests/quant_fixtures/build_moe.py --mixtral
  GPTQMODEL_CPU_WORKERS=2 /tmp/qtools/bin/python tests/quant_fixtures/build_moe.py --float-experts
  ONLY=gptq_g32_sym_qwen3_moe,gptq_g32_sym_qwen3_moe_float_experts \
      .venv/bin/python tests/quant_fixtures/build.py verify
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
FLOAT_EXPERTS = "gptq_g32_sym_qwen3_moe_float_experts"
# gptqmodel's `dynamic`: a `-:` key is a regex (re.match) of modules it leaves unquantized.
EXPERTS_UNQUANTIZED = {"-:.*\\.experts\\..*": {}}
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
# --mixtral: a Mixtral of the same width, its 4 experts of intermediate_size 64 in every layer
MIXTRAL = "gptq_g32_sym_mixtral"
MIXTRAL_SPEC = dict(
    SPEC,
    arch="MixtralForCausalLM",
    seed=114,
    config=dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64),
)
# --float-experts: the same builder, seed and calibration at half the width (hidden 64, so
# head_dim 16; experts' intermediate 32), since its reference/ holds every expert in fp32 and
# the whole directory should stay under 1 MB.
FLOAT_EXPERTS_SPEC = dict(SPEC, config=dict(MOE, hidden_size=64, moe_intermediate_size=32))


def quantize(work: Path, name: str, spec: dict, dynamic: dict | None) -> Path:
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig

    fx = HERE / name
    if fx.exists():
        shutil.rmtree(fx)
    float_dir = build.build_float(spec, work / "float")
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
        dynamic=dynamic,
    )
    model = GPTQModel.load(str(tool_dir), qc, dtype=torch.float16)
    ids = build.calib_ids(float_dir)
    model.quantize([{"input_ids": i, "attention_mask": [1] * len(i)} for i in ids], batch_size=1)
    model.save(str(fx))
    del model
    build.finish_quant_dir(fx, float_dir)
    return float_dir


def what_was_quantized(fx: Path, float_experts: bool) -> dict:
    """Which modules gptqmodel quantized (the experts, or with --float-experts none of them)."""
    from safetensors.torch import load_file

    sd = load_file(fx / "model.safetensors")
    experts = [
        f"model.layers.{i}.mlp.experts.{e}.{proj}"
        for i in range(2)
        for e in range(MOE["num_experts"])
        for proj in ("gate_proj", "up_proj", "down_proj")
    ]
    router = sorted(k for k in sd if k.endswith(".mlp.gate.weight"))
    attention = sorted(k for k in sd if ".self_attn." in k and k.endswith(".qweight"))
    with open(fx / "quant_log.csv") as f:
        samples = {(r["layer"], r["module"]): int(r["samples"]) for r in csv.DictReader(f)}
    expert_samples = {k: v for k, v in samples.items() if ".experts." in k[1]}
    assert len(attention) == 2 * 4, attention
    found = dict(
        check="what gptqmodel quantized",
        quantized_attention_modules=len(attention),
        router=f"{router} kept as {sd[router[0]].dtype}",
    )
    if float_experts:
        assert all(f"{m}.weight" in sd and f"{m}.qweight" not in sd for m in experts)
        dtypes = {str(sd[f"{m}.weight"].dtype) for m in experts}
        assert dtypes == {"torch.float16"} and not expert_samples, (dtypes, expert_samples)
        dynamic = json.loads((fx / "config.json").read_text())["quantization_config"]["dynamic"]
        assert dynamic == EXPERTS_UNQUANTIZED, dynamic
        return dict(
            found,
            float_expert_modules=f"{len(experts)}, saved as `.weight` {sorted(dtypes)}",
            quantization_config_dynamic=dynamic,
            quant_log_expert_rows=len(expert_samples),
        )
    assert all(f"{m}.qweight" in sd and f"{m}.weight" not in sd for m in experts)
    assert min(expert_samples.values()) > 0, expert_samples
    return dict(
        found,
        quantized_expert_modules=len(experts),
        calibration_tokens_per_expert_module=dict(
            min=min(expert_samples.values()), max=max(expert_samples.values())
        ),
    )


def tool_dequant(fx: Path) -> tuple[dict, list]:
    """gptqmodel's own dequantization of every quantized module ((out, in) fp32, scales in
    fp32 so that scale * (q - z) is exact), and its own fp16 forward on build.LOGIT_PROBE."""
    import torch
    from gptqmodel import BACKEND, GPTQModel
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear

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
    return dequant, tool_logits


def layout_check(fx: Path, dequant: dict) -> dict:
    """The README's GPTQ layout, in plain torch, on every quantized module, == gptqmodel's."""
    from safetensors.torch import load_file

    sd = load_file(fx / "model.safetensors")
    worst, n = 0.0, 32 // SPEC["bits"]
    keys = [k for k in sd if k.endswith(".qweight")]
    for key in keys:
        p = key.rsplit(".", 1)[0]
        iw = build._fields(sd[p + ".qweight"], SPEC["bits"], n).permute(0, 2, 1).flatten(0, 1)
        iz = build._fields(sd[p + ".qzeros"], SPEC["bits"], n).flatten(1)
        gi = sd[p + ".g_idx"].long()
        w = ((iw - (iz[gi] + 1)) * sd[p + ".scales"].float()[gi]).t()
        worst = max(worst, (w - dequant[p]).abs().max().item())
    assert worst == 0.0 and len(keys) == len(dequant), (worst, len(keys), len(dequant))
    return dict(
        check="README.md's GPTQ (v1) layout unpacked in plain torch == gptqmodel dequantize_weight()",
        modules=len(dequant),
        max_abs_diff=worst,
    )


def checks(fx: Path, float_dir: Path) -> list[dict]:
    """The int4-experts fixture (no reference/): the tool against the float source."""
    import torch
    from transformers import AutoModelForCausalLM

    found = [what_was_quantized(fx, float_experts=False)]
    dequant, tool_logits = tool_dequant(fx)
    found.append(layout_check(fx, dequant))
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


def reference_and_checks(fx: Path, float_dir: Path, float_experts: bool = True) -> list[dict]:
    """reference/ as build.py's gptq stage writes it (gptqmodel's dequantized modules: attention,
    and the experts unless `float_experts`; every other tensor cast to fp32), then the dense
    fixtures' checks against it."""
    found = [what_was_quantized(fx, float_experts=float_experts)]
    dequant, tool_logits = tool_dequant(fx)
    found.append(layout_check(fx, dequant))
    build.write_reference(fx, dequant)
    found.append(build.float_vs_ref(fx, float_dir))
    found.append(
        build.compare(fx, tool_logits, "gptqmodel GPTQModel.load(backend=gptq_torch) fp16 forward")
    )
    try:
        found.append(
            build.compare(
                fx,
                build.transformers_on_quant_dir(fx),
                "transformers AutoModelForCausalLM fp32 on the quantized dir (optimum + gptqmodel auto kernel)",
            )
        )
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        found.append(dict(against="transformers on the quantized dir", error=repr(e)[:500]))
    for c in found:
        print(" ", c)
    return found


def reference_of_int4_experts() -> None:
    """--reference: reference/ of the int4-experts fixture as it stands, and provenance.json's
    checks again (the float source rebuilt from its seed for the comparisons)."""
    fx = HERE / NAME
    work = Path(tempfile.mkdtemp(prefix="quant_moe_"))
    os.chdir(work)
    try:
        float_dir = build.build_float(SPEC, work / "float")
        found = reference_and_checks(fx, float_dir, float_experts=False)
        prov = json.loads((fx / "provenance.json").read_text())
        prov["reference"] = dict(
            function="gptqmodel GPTQModel.load(quant_dir, backend=BACKEND.GPTQ_TORCH); per quant module "
            "(attention and every expert's gate/up/down_proj): dequantize_weight() with scales cast to "
            "fp32, transposed; every other tensor (router, norms, embeddings) cast to fp32",
            dtype="float32",
            written_by="build_moe.py --reference, from the checkpoint as quantized (not quantized again)",
        )
        prov["notes"] = [n for n in prov.get("notes", []) if not n.startswith("No reference/")]
        prov["checks"] = found
        build.write_provenance(fx, prov)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_mixtral() -> None:
    """--mixtral: a tiny Mixtral quantized by gptqmodel's own `mixtral` definition (attention
    and every expert int4, the router fp16), reference/ written at once. gptqmodel splits
    transformers 5's stacked experts into modules of their own and saves them as
    `mlp.experts.{e}.gate_proj/up_proj/down_proj` with the router `mlp.gate`, not the Hub's
    `block_sparse_moe.experts.{e}.w1/w3/w2`: the layout this fixture pins."""
    import gptqmodel

    work = Path(tempfile.mkdtemp(prefix="quant_moe_"))
    os.chdir(work)
    try:
        float_dir = quantize(work, MIXTRAL, MIXTRAL_SPEC, None)
        fx = HERE / MIXTRAL
        prov = build.base_provenance(MIXTRAL, MIXTRAL_SPEC)
        prov.update(
            tool=dict(name="gptqmodel", version=gptqmodel.__version__),
            function="gptqmodel.GPTQModel.load(float_dir, QuantizeConfig(...), dtype=float16) -> .quantize(calib) -> .save() "
            "(gptqmodel/models/definitions/mixtral.py: q/k/v/o_proj and every expert, saved as "
            "mlp.experts.{e}.gate_proj/up_proj/down_proj; mlp.gate not quantized)",
            parameters=dict(
                bits=SPEC["bits"],
                group_size=SPEC["group_size"],
                desc_act=SPEC["desc_act"],
                sym=SPEC["sym"],
                checkpoint_format=SPEC["format"],
                pack_dtype="int32",
                lm_head_quantized=False,
            ),  # fmt: skip
            versions=build._versions("gptqmodel", "optimum", "defuser"),
            reference=dict(
                function="gptqmodel GPTQModel.load(quant_dir, backend=BACKEND.GPTQ_TORCH); per quant module "
                "(attention and every expert): dequantize_weight() with scales cast to fp32, transposed; "
                "every other tensor cast to fp32",
                dtype="float32",
            ),
            notes=[
                "gptqmodel 7.7.0 requires torch>=2.14.1 on paper; installed with --no-deps on torch 2.13.0+cpu and ran on CPU."
            ],
            checks=mixtral_reference_and_checks(fx, float_dir),
        )
        build.write_provenance(fx, prov)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def mixtral_reference_and_checks(fx: Path, float_dir: Path) -> list[dict]:
    """reference/ written as the Hub's Mixtral checkpoint (block_sparse_moe.experts.{e}.w1/w3/w2,
    block_sparse_moe.gate) with safetensors, not save_pretrained: importing gptqmodel swaps
    transformers' stacked Mixtral experts for modules of their own (its defuser), and
    save_pretrained's conversion back to the Hub's names then writes a mix of both layouts."""
    import torch
    from safetensors.torch import load_file, save_file

    found = [what_was_quantized(fx, float_experts=False)]
    dequant, tool_logits = tool_dequant(fx)
    found.append(layout_check(fx, dequant))
    tensors = {}
    for key, value in load_file(fx / "model.safetensors").items():
        prefix, leaf = key.rsplit(".", 1)
        if prefix not in dequant:
            tensors[key.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = value.float()
    for prefix, weight in dequant.items():
        tensors[f"{build.hub_expert_name(prefix)}.weight"] = weight.float().contiguous()
    ref = fx / "reference"
    shutil.rmtree(ref, ignore_errors=True)
    ref.mkdir()
    save_file(tensors, ref / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((fx / "config.json").read_text())
    config.pop("quantization_config")
    config["dtype"] = "float32"
    (ref / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    assert torch.isfinite(torch.cat([t.flatten() for t in tensors.values()])).all()
    found.append(build.float_vs_ref(fx, float_dir))
    found.append(
        build.compare(fx, tool_logits, "gptqmodel GPTQModel.load(backend=gptq_torch) fp16 forward")
    )
    for c in found:
        print(" ", c)
    return found


def main(argv: list[str]) -> None:
    import gptqmodel

    if argv == ["--reference"]:
        reference_of_int4_experts()
        return
    if argv == ["--mixtral"]:
        build_mixtral()
        return
    float_experts = argv == ["--float-experts"]
    if argv and not float_experts:
        sys.exit(f"usage: build_moe.py [--float-experts | --reference | --mixtral], not {argv}")
    name = FLOAT_EXPERTS if float_experts else NAME
    dynamic = EXPERTS_UNQUANTIZED if float_experts else None
    work = Path(tempfile.mkdtemp(prefix="quant_moe_"))
    os.chdir(work)  # gptqmodel writes its logs/ under the working directory: not in the repo
    try:
        spec = FLOAT_EXPERTS_SPEC if float_experts else SPEC
        float_dir = quantize(work, name, spec, dynamic)
        fx = HERE / name
        prov = build.base_provenance(name, spec)
        if float_experts:
            modules = (
                "q/k/v/o_proj only: the dynamic rule leaves every mlp.experts.{e}.gate/up/down_proj "
                "in fp16, and mlp.gate is not quantized"
            )
        else:
            modules = (
                "q/k/v/o_proj and every mlp.experts.{e}.gate/up/down_proj; mlp.gate not quantized"
            )
        prov.update(
            tool=dict(name="gptqmodel", version=gptqmodel.__version__),
            function="gptqmodel.GPTQModel.load(float_dir, QuantizeConfig(...), dtype=float16) -> .quantize(calib) -> .save() "
            f"(gptqmodel/models/definitions/qwen3_moe.py: {modules})",
            parameters=dict(
                bits=SPEC["bits"],
                group_size=SPEC["group_size"],
                desc_act=SPEC["desc_act"],
                sym=SPEC["sym"],
                checkpoint_format=SPEC["format"],
                act_group_aware=False,
                pack_dtype="int32",
                lm_head_quantized=False,
                dynamic=dynamic,
            ),
            versions=build._versions("gptqmodel", "optimum", "defuser"),
        )
        if float_experts:
            prov.update(
                reference=dict(
                    function="gptqmodel GPTQModel.load(quant_dir, backend=BACKEND.GPTQ_TORCH); per quant module: "
                    "dequantize_weight() (gptqmodel/nn_modules/qlinear/__init__.py PackableQuantLinear) with scales "
                    "cast to fp32, transposed; every other tensor (the fp16 experts included) cast to fp32",
                    dtype="float32",
                ),
                notes=[
                    "The builder, seed and calibration of gptq_g32_sym_qwen3_moe at half its width (hidden_size 64, moe_intermediate_size 32: "
                    "the fp32 reference/ of float experts stays small); QuantizeConfig differs only by `dynamic`.",
                    "transformers (+ optimum + gptqmodel) cannot load the quantized dir: gptqmodel itself warns that "
                    "per-module `dynamic` is 'not yet available in hf transformers', which builds GPTQ linears for the "
                    "experts too, reports their qweight/qzeros/scales/g_idx MISSING and the fp16 expert weights "
                    "UNEXPECTED, and fails on the uninitialised g_idx (the recorded error).",
                    "gptqmodel 7.7.0 requires torch>=2.14.1 on paper; installed with --no-deps on torch 2.13.0+cpu and ran on CPU.",
                ],
                checks=reference_and_checks(fx, float_dir),
            )
        else:
            prov.update(
                notes=[
                    "reference/ is written by build_moe.py --reference (run it after this).",
                    "gptqmodel 7.7.0 requires torch>=2.14.1 on paper; installed with --no-deps on torch 2.13.0+cpu and ran on CPU.",
                ],
                checks=checks(fx, float_dir),
            )
        build.write_provenance(fx, prov)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
