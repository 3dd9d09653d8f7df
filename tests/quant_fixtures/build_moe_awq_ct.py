# ruff: noqa: E501 - long provenance strings and install commands are kept whole
"""Builds two more int4 Mixture-of-Experts fixtures with the formats' OWN tools (never with
Switchyard code), in the style of build_moe.py's gptq_g32_sym_qwen3_moe: the same tiny Qwen3-MoE
(build_moe.SPEC's shape: 4 experts, top 2 renormalised, moe_intermediate_size 64, hidden 128),
attention and every routed expert's gate/up/down_proj quantized, the router `mlp.gate` kept in
fp16, saved in the Hub's per-expert layout.

Stages:
  awq  awq_gemm_g32_qwen3_moe (seed 112): gptqmodel 7.7.0's own AWQ method
       (QuantizeConfig(quant_method=METHOD.AWQ, format=FORMAT.GEMM, bits 4, group 32,
       sym=False -> zero_point true), its `qwen3_moe` definition; transformers 5's stacked experts
       are split per expert by its `defuser` dependency). `mlp.experts.{e}.gate_proj.qweight`,
       `.qzeros`, `.scales` in AutoAWQ's GEMM layout. reference/: gptqmodel's own AWQ unpacker
       (gptqmodel/quantization/awq/utils/packing_utils.py dequantize_gemm, the one its AWQ kernels
       use) on the modules GPTQModel.load built, scales in fp32; checked against AutoAWQ 0.2.9's
       awq.utils.packing_utils.dequantize_gemm on the file (must be equal).
  ct   ct_w4a16_group32_asym_qwen3_moe (seed 113): llmcompressor 0.14.0.1 oneshot +
       GPTQModifier(W4A16 group 32 asymmetric, targets Linear, ignore ["lm_head",
       "re:.*mlp.gate$"]); oneshot linearizes the fused experts itself (linearize_moe) and
       calibrates every expert on every token (moe_calibrate_all_experts, its default); saved
       `mlp.experts.{e}.gate_proj.weight_packed` ... (compressed-tensors 0.19.0 pack-quantized).
       reference/: compressed-tensors' PackedQuantizationCompressor.decompress, scales in fp32,
       as build.py's build_ct.

Venvs: the two of build.py's docstring (awq: /tmp/qtools; ct: /tmp/qllmc). From the repo root:

  GPTQMODEL_CPU_WORKERS=2 /tmp/qtools/bin/python tests/quant_fixtures/build_moe_awq_ct.py awq   # ~10 s
  /tmp/qllmc/bin/python tests/quant_fixtures/build_moe_awq_ct.py ct                              # ~20 s
  ONLY=awq_gemm_g32_qwen3_moe,ct_w4a16_group32_asym_qwen3_moe \
      .venv/bin/python tests/quant_fixtures/build.py verify   # README layouts + expected.json
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
import build_moe  # noqa: E402 - the tiny Qwen3-MoE's shape

AWQ_NAME = "awq_gemm_g32_qwen3_moe"
CT_NAME = "ct_w4a16_group32_asym_qwen3_moe"
MOE = build_moe.MOE
MOE_ARCH = build_moe.SPEC["arch"]
# The GPTQ fixture's source model and group size (build_moe.SPEC), each its own seed and scheme
_SOURCE = dict(arch=MOE_ARCH, tie=False, bits=4, group_size=32, config=MOE)
AWQ_SPEC = dict(_SOURCE, tool="awq", seed=112, sym=False, format="gemm")
CT_SPEC = dict(_SOURCE, tool="ct", seed=113, strategy="group", symmetric=False)
# vLLM users' ignore list for Qwen3-MoE: lm_head and every router (mlp.gate, not mlp.gate_proj).
CT_IGNORE = ["lm_head", "re:.*mlp.gate$"]
LAYERS = build.SHAPE["num_hidden_layers"]


def experts() -> list[str]:
    return [
        f"model.layers.{i}.mlp.experts.{e}.{proj}"
        for i in range(LAYERS)
        for e in range(MOE["num_experts"])
        for proj in ("gate_proj", "up_proj", "down_proj")
    ]


def what_was_quantized(fx: Path, packed: str) -> dict:
    """Attention and every expert saved packed (`packed` = qweight / weight_packed), per expert,
    no floating-point `.weight` left for them; the router kept in floating point."""
    from safetensors.torch import load_file

    sd = load_file(fx / "model.safetensors")
    attention = sorted(k for k in sd if ".self_attn." in k and k.endswith("." + packed))
    router = sorted(k for k in sd if k.endswith(".mlp.gate.weight"))
    ex = experts()
    assert len(attention) == LAYERS * 4, attention
    assert all(f"{m}.{packed}" in sd and f"{m}.weight" not in sd for m in ex)
    assert not [k for k in sd if ".mlp.gate." in k and not k.endswith(".mlp.gate.weight")]
    assert len(router) == LAYERS and all(sd[r].is_floating_point() for r in router), router
    packed_keys = sorted(k for k in sd if k.endswith("." + packed))
    assert len(packed_keys) == len(attention) + len(ex), len(packed_keys)
    return dict(
        check="what was quantized",
        quantized_attention_modules=len(attention),
        quantized_expert_modules=f"{len(ex)} (every routed expert's gate/up/down_proj, saved per expert as model.layers.N.mlp.experts.E.<proj>.{packed} ...)",
        router=f"{router} kept as {sd[router[0]].dtype}",
        unquantized_tensors=sorted(
            {k.split(".")[-2] + "." + k.split(".")[-1] for k in sd if k.endswith(".weight")}
        ),
    )


def _restack_if_fused(new: dict, config) -> None:
    """write_reference's restack: only where this transformers holds Qwen3-MoE's experts fused
    (transformers 5 without gptqmodel's defuser patch): per-expert weights -> its 3-D tensors."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        keys = set(AutoModelForCausalLM.from_config(config).state_dict())
    if "model.layers.0.mlp.experts.gate_up_proj" in keys:
        import build_fp8

        build_fp8._stack_experts(new, config)


def check_reference_per_expert(fx: Path, dequant: dict) -> dict:
    """reference/ holds every quantized module's dequantized weight under the checkpoint's own
    (per-expert) name, exactly (what layouts() and the serving tests read)."""
    import torch
    from safetensors.torch import load_file

    saved = load_file(fx / "reference" / "model.safetensors")
    for p, w in dequant.items():
        assert torch.equal(saved[p + ".weight"], w.float()), p
    return dict(
        check="reference/ saved per expert: every dequantized module's .weight stored as computed",
        modules=len(dequant),
    )


def _float_vs_tool(float_dir: Path, tool_logits: list, what: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        fl = [source(torch.tensor([ids])).logits[0] for ids in build.LOGIT_PROBE]
    return dict(
        check=f"{what} vs the float32 source (expect a small nonzero gap)",
        max_abs_logit_diff=max(
            (a - b.float()).abs().max().item() for a, b in zip(fl, tool_logits, strict=True)
        ),
        argmax_equal_positions=f"{sum(int((a.argmax(-1) == b.float().argmax(-1)).sum()) for a, b in zip(fl, tool_logits, strict=True))}/{sum(len(i) for i in build.LOGIT_PROBE)}",
    )


def _try(found: list, what: str, fn) -> None:
    try:
        found.append(fn())
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        found.append(dict(against=what, error=repr(e)[:500]))
        print(f"  {what} failed:", repr(e)[:300])


def _fresh(name: str) -> Path:
    fx = HERE / name
    if fx.exists():
        shutil.rmtree(fx)
    return fx


# ---------------------------------------------------------------- AWQ (gptqmodel)


def build_awq(work: Path) -> None:
    import gptqmodel
    import torch
    from gptqmodel import GPTQModel
    from gptqmodel.quantization import FORMAT, METHOD, QuantizeConfig

    name, spec = AWQ_NAME, AWQ_SPEC
    fx = _fresh(name)
    float_dir = build.build_float(spec, work / "float")
    # As build.py / build_moe.py: gptqmodel's tokenizer helper gets a copy whose pad token is '<unk>'.
    tool_dir = work / "float_for_tool"
    shutil.copytree(float_dir, tool_dir)
    tcfg = json.loads((tool_dir / "tokenizer_config.json").read_text())
    tcfg["pad_token"] = "<unk>"
    (tool_dir / "tokenizer_config.json").write_text(json.dumps(tcfg))
    qc = QuantizeConfig(
        quant_method=METHOD.AWQ,
        format=FORMAT.GEMM,
        bits=spec["bits"],
        group_size=spec["group_size"],
        sym=spec["sym"],
        offload_to_disk=False,
    )
    print(" ", type(qc).__name__, qc.quant_method, qc.format)
    model = GPTQModel.load(str(tool_dir), qc, dtype=torch.float16)
    ids = build.calib_ids(float_dir)
    model.quantize([{"input_ids": i, "attention_mask": [1] * len(i)} for i in ids], batch_size=1)
    model.save(str(fx))
    del model
    build.finish_quant_dir(fx, float_dir)

    found = [what_was_quantized(fx, "qweight")]
    found[0].update(awq_calibration(fx))
    found.append(awq_norms_and_router(fx, float_dir))
    dequant, tool_logits, kernel = awq_tool_dequant(fx, spec)
    found.append(awq_against_autoawq(fx, dequant, spec))
    build.write_reference(fx, dequant, restack=_restack_if_fused)
    found.append(check_reference_per_expert(fx, dequant))
    found.append(build.float_vs_ref(fx, float_dir))
    found.append(
        build.compare(
            fx, tool_logits, f"gptqmodel GPTQModel.load(backend=awq_torch) fp16 forward ({kernel})"
        )
    )
    found.append(_float_vs_tool(float_dir, tool_logits, "gptqmodel's own fp16 forward"))
    what = "transformers AutoModelForCausalLM fp32 on the quantized dir (its AWQ integration, gptqmodel kernels)"
    _try(found, what, lambda: build.compare(fx, build.transformers_on_quant_dir(fx), what))
    for c in found:
        print(" ", c)

    prov = build.base_provenance(name, spec)
    prov.update(
        tool=dict(name="gptqmodel", version=gptqmodel.__version__, method="awq"),
        function="gptqmodel.GPTQModel.load(float_dir, QuantizeConfig(quant_method=METHOD.AWQ, format=FORMAT.GEMM, ...), dtype=float16) "
        "-> .quantize(calib) (gptqmodel/looper/awq_processor.py: activation-aware scale search + clipping per scaling group, "
        "gptqmodel/models/definitions/qwen3_moe.py: q/k/v/o_proj and every mlp.experts.{e}.gate/up/down_proj; mlp.gate not quantized) -> .save()",
        parameters=dict(
            quant_method="awq",
            format="gemm",
            bits=spec["bits"],
            group_size=spec["group_size"],
            sym=spec["sym"],
            zero_point=True,
            desc_act=False,
            pack_dtype="int32",
            lm_head_quantized=False,
            offload_to_disk=False,
            quantize_config_class=type(qc).__name__,
        ),
        reference=dict(
            function="gptqmodel GPTQModel.load(quant_dir, backend=BACKEND.AWQ_TORCH, dtype=float16); per AWQ quant module "
            "(attention and every expert's gate/up/down_proj): gptqmodel.quantization.awq.utils.packing_utils.dequantize_gemm("
            "qweight, qzeros, scales.float(), bits, group_size).T; every other tensor (router, norms, embeddings, lm_head) cast to fp32",
            dtype="float32",
            cross_check="AutoAWQ 0.2.9 awq.utils.packing_utils.dequantize_gemm on the saved tensors gives the same weights (checks)",
        ),
        versions=build._versions("gptqmodel", "defuser", "autoawq", "optimum"),
        notes=[
            "AWQ folds its activation scales into the op before each scaled group: input_layernorm (q/k/v), "
            "post_attention_layernorm (every expert's gate/up_proj), each expert's up_proj (its down_proj); o_proj is "
            "scaled only where v_proj's shape matches (not here: GQA). So the saved norms are not the float source's "
            "and the checkpoint's up_proj rows carry the down_proj scales: always take the non-linear tensors from the checkpoint.",
            "The router mlp.gate reads post_attention_layernorm's output too, but gptqmodel's (like AutoAWQ's own qwen3_moe) "
            "scaling group for the experts' gate/up_proj does not include it, so the router is not compensated: the saved "
            "router weight is the float source's (fp16) and it sees the rescaled norm (its search measures the whole MoE "
            "block's output, router included). This is the checkpoint as AWQ writes it; reference/ is the same model.",
            "gptqmodel 7.7.0 requires torch>=2.14.1 on paper; installed with --no-deps on torch 2.13.0+cpu and ran on CPU.",
        ],
        checks=found,
    )
    build.write_provenance(fx, prov)


def awq_calibration(fx: Path) -> dict:
    """quant_log.csv: gptqmodel's AWQ `samples` column, the token rows its scale search kept for
    each module (gate/up_proj of all experts share one group: the MoE block's input)."""
    with open(fx / "quant_log.csv") as f:
        rows = [r for r in csv.DictReader(f)]
    per = {
        f"layer {r['layer']} {r['module']}": int(r["samples"])
        for r in rows
        if ".experts." in r["module"]
    }
    assert len(per) == len(experts()) and min(per.values()) > 0, per
    return dict(
        quant_log_expert_rows=len(per),
        awq_scale_search_token_rows_per_expert_module=dict(
            gate_up_proj=sorted({v for k, v in per.items() if "down_proj" not in k}),
            down_proj=sorted({v for k, v in per.items() if "down_proj" in k}),
            note="quant_log.csv `samples`: token rows gptqmodel's AWQ kept for the module's scale search "
            "(gate/up_proj: the MoE block input, its token-row budget; down_proj: rows of the tokens routed to "
            "that expert, capped by the same budget); every expert got calibration data",
        ),
    )


def awq_norms_and_router(fx: Path, float_dir: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    q, f = load_file(fx / "model.safetensors"), load_file(float_dir / "model.safetensors")

    def ratio(k):
        r = q[k].float() / f[k].float()
        return [round(r.min().item(), 4), round(r.max().item(), 4)]

    router = max(
        (q[k].float() - f[k].float()).abs().max().item()
        for k in q
        if k.endswith(".mlp.gate.weight")
    )
    fp16_round = max(
        (f[k].half().float() - f[k].float()).abs().max().item()
        for k in q
        if k.endswith(".mlp.gate.weight")
    )
    assert router == fp16_round, (router, fp16_round)
    return dict(
        check="AWQ scales folded into the norms; the router unchanged",
        post_attention_layernorm_ratio_to_float_min_max={
            i: ratio(f"model.layers.{i}.post_attention_layernorm.weight") for i in range(LAYERS)
        },
        input_layernorm_ratio_to_float_min_max={
            i: ratio(f"model.layers.{i}.input_layernorm.weight") for i in range(LAYERS)
        },
        router_max_abs_diff_to_float_source=router,
        router_equals_float_source_rounded_to_fp16=bool(
            torch.isclose(torch.tensor(router), torch.tensor(fp16_round))
        ),
    )


def awq_tool_dequant(fx: Path, spec: dict) -> tuple[dict, list, list]:
    """gptqmodel's own AWQ dequantization of every module its loader built, and its own fp16
    forward (BACKEND.AWQ_TORCH) on build.LOGIT_PROBE."""
    import torch
    from gptqmodel import BACKEND, GPTQModel
    from gptqmodel.nn_modules.qlinear import AWQuantLinear
    from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm

    qm = GPTQModel.load(str(fx), backend=BACKEND.AWQ_TORCH, device="cpu", dtype=torch.float16)
    dequant, tool_logits = {}, []
    with torch.no_grad():
        for mname, mod in qm.model.named_modules():
            if isinstance(mod, AWQuantLinear):
                w = dequantize_gemm(
                    mod.qweight, mod.qzeros, mod.scales.float(), mod.bits, mod.group_size
                )
                dequant[mname] = w.t().float().contiguous()  # (in, out) -> (out, in)
        for ids in build.LOGIT_PROBE:
            tool_logits.append(qm.model(torch.tensor([ids])).logits[0].float())
    kernel = sorted({type(m).__name__ for m in qm.model.modules() if isinstance(m, AWQuantLinear)})
    del qm
    assert set(dequant) == {k.rsplit(".", 1)[0] for k in _keys(fx) if k.endswith(".qweight")}, (
        sorted(dequant)
    )
    return dequant, tool_logits, kernel


def _keys(fx: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(fx / "model.safetensors", "pt") as f:
        return set(f.keys())


def awq_against_autoawq(fx: Path, dequant: dict, spec: dict) -> dict:
    """AutoAWQ's own unpacker (the GEMM format's original library) on the saved tensors."""
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file

    sd = load_file(fx / "model.safetensors")
    worst = 0.0
    for p, w in dequant.items():
        a = dequantize_gemm(
            sd[p + ".qweight"],
            sd[p + ".qzeros"],
            sd[p + ".scales"].float(),
            spec["bits"],
            spec["group_size"],
        ).t()
        worst = max(worst, (a - w).abs().max().item())
    assert worst == 0.0, worst
    return dict(
        check="AutoAWQ 0.2.9 awq.utils.packing_utils.dequantize_gemm on the saved tensors == gptqmodel's dequantize_gemm on its loaded modules",
        modules=len(dequant),
        max_abs_diff=worst,
    )


# ---------------------------------------------------------------- compressed-tensors (llmcompressor)


def build_ct(work: Path) -> None:
    import compressed_tensors
    import llmcompressor
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modeling.moe.linearize import get_linearized_moes
    from llmcompressor.modifiers.gptq import GPTQModifier
    from transformers import AutoModelForCausalLM

    name, spec = CT_NAME, CT_SPEC
    fx = _fresh(name)
    float_dir = build.build_float(spec, work / "float")
    model = AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float16)
    fused = type(model.model.layers[0].mlp.experts).__name__
    weights = dict(
        num_bits=spec["bits"],
        type="int",
        symmetric=spec["symmetric"],
        strategy=spec["strategy"],
        group_size=spec["group_size"],
    )
    config_groups = {"group_0": {"targets": ["Linear"], "weights": weights}}
    recipe = GPTQModifier(config_groups=config_groups, ignore=CT_IGNORE)
    ds = Dataset.from_dict({"input_ids": build.calib_ids(float_dir)})
    rows = observe_gptq_calibration()
    oneshot(
        model=model,
        dataset=ds,
        recipe=recipe,
        max_seq_length=64,
        num_calibration_samples=build.N_CALIB,
    )
    linearized = type(model.model.layers[0].mlp.experts).__name__
    assert len(get_linearized_moes(model)) == LAYERS, linearized
    # llmcompressor's own forward of the model it quantized (fake-quantized weights), before saving.
    model.eval()
    with torch.no_grad():
        tool_logits = [model(torch.tensor([ids])).logits[0].float() for ids in build.LOGIT_PROBE]
    model.save_pretrained(fx, save_compressed=True)
    del model
    build.finish_quant_dir(fx, float_dir)

    found = [what_was_quantized(fx, "weight_packed")]
    per = {k: v for k, v in rows.items() if ".experts." in k}
    assert sorted(per) == sorted(experts()) and min(per.values()) > 0, per
    total = sum(len(i) for i in build.calib_ids(float_dir))
    found[0].update(
        experts_in_memory=f"transformers {fused} (fused 3-D) linearized by oneshot into {linearized} (one nn.Linear per expert and proj)",
        gptq_calibration_token_rows_per_expert_module=dict(
            min=min(per.values()),
            max=max(per.values()),
            calibration_tokens=total,
            note="rows of input GPTQModifier.calibrate_module accumulated into each expert's Hessian; "
            "moe_calibrate_all_experts=True (oneshot's default) runs every expert on every token (only the routed "
            "tokens' outputs are used)",
        ),
    )

    # Reference: compressed-tensors' own decompressor for the saved format, scales in fp32.
    dequant = build.ct_dequantized(fx)
    build.write_reference(fx, dequant, restack=_restack_if_fused)
    found.append(check_reference_per_expert(fx, dequant))
    found.append(build.float_vs_ref(fx, float_dir))
    found.append(
        build.compare(
            fx,
            tool_logits,
            "llmcompressor's own fp16 forward of the model it quantized (fake-quantized weights, before saving)",
        )
    )
    found.append(_float_vs_tool(float_dir, tool_logits, "llmcompressor's own fp16 forward"))
    what = "transformers AutoModelForCausalLM fp32 on the quantized dir (compressed-tensors decompresses on load)"
    _try(found, what, lambda: ct_transformers_check(fx, what))
    for c in found:
        print(" ", c)

    prov = build.base_provenance(name, spec)
    prov.update(
        tool=dict(
            name="llmcompressor",
            version=llmcompressor.__version__,
            compressed_tensors=compressed_tensors.__version__,
        ),
        function="llmcompressor.oneshot(model(fp16), dataset, recipe=GPTQModifier(config_groups, ignore=[...])) "
        "(oneshot linearizes the fused experts itself: llmcompressor.modeling.moe.linearize.linearize_moe, and calibrates "
        "all experts: moe_calibration_context) -> model.save_pretrained(save_compressed=True) "
        "(ModelCompressor -> PackedQuantizationCompressor.compress)",
        parameters=dict(
            config_groups=config_groups,
            ignore=CT_IGNORE,
            ignore_as_saved=json.loads((fx / "config.json").read_text())["quantization_config"][
                "ignore"
            ],
            moe_calibrate_all_experts=True,
            format="pack-quantized",
            strategy=spec["strategy"],
            symmetric=spec["symmetric"],
            group_size=spec["group_size"],
            bits=spec["bits"],
        ),
        reference=dict(
            function="compressed_tensors.compressors.pack_quantized.base.PackedQuantizationCompressor.decompress"
            "({weight_packed, weight_scale.float(), weight_zero_point, weight_shape}, scheme)['weight'] for attention and "
            "every expert's gate/up/down_proj; every other tensor (router, norms, embeddings, lm_head) cast to fp32",
            dtype="float32",
        ),
        versions=build._versions("llmcompressor", "compressed-tensors"),
        notes=[
            "llmcompressor's recommended loader, `with llmcompressor.modeling.moe.linearize.load_quantizable_moe(): "
            "AutoModelForCausalLM.from_pretrained(...)`, fails in this venv: transformers 5.17's monkey_patching.apply_patches "
            "walks every lazily imported transformers module and imports aria's image processor, "
            "ModuleNotFoundError(\"No module named 'torchvision'\") (and torchvision 0.28.0, the CPU wheel that "
            "pins torch==2.13.0, would not import on this torch: RuntimeError('operator torchvision::nms does not exist')). "
            "The model is loaded plainly instead, and oneshot "
            "linearizes the experts after loading (its own fallback, which it warns about); the saved names are the Hub's per-expert ones.",
            "Plain transformers cannot load the quantized dir (the recorded error): its expert loader "
            "(transformers/integrations/compressed_tensors.py, DecompressExperts in 5.17, CompressedTensorsDequantize's "
            "experts path in 5.23) builds each expert's DummyModule from weight_packed, weight_scale and weight_shape only, "
            "so compressed-tensors' PackedQuantizationCompressor.decompress gets no weight_zero_point and asserts "
            "'Asymmetric quant requires zero-point values'. transformers 5.23.0 + compressed-tensors 0.20.0 (/tmp/qtools) "
            "fail the same way. The checkpoint has every expert's weight_zero_point; reference/ decompresses with them.",
            "llmcompressor resolves the `re:.*mlp.gate$` ignore rule into the module names it matched, so config.json's "
            "`ignore` lists each layer's `mlp.gate` and `lm_head` (parameters.ignore_as_saved).",
        ],
        checks=found,
    )
    build.write_provenance(fx, prov)


def observe_gptq_calibration() -> dict:
    """Counts, per module name, the input rows GPTQModifier's calibration hook accumulates (a
    read-only wrapper around its calibrate_module)."""
    from llmcompressor.modifiers.gptq import GPTQModifier

    rows: dict[str, int] = {}
    original = GPTQModifier.calibrate_module

    def calibrate_module(self, module, args, _output):
        inp = args[0]
        n = self._module_names.get(module, repr(module))
        rows[n] = rows.get(n, 0) + inp.numel() // inp.shape[-1]
        return original(self, module, args, _output)

    GPTQModifier.calibrate_module = calibrate_module
    return rows


def ct_transformers_check(fx: Path, what: str) -> dict:
    """transformers 5.17 + compressed-tensors 0.19 on the quantized dir."""
    import torch
    from transformers import AutoModelForCausalLM

    m, info = AutoModelForCausalLM.from_pretrained(
        fx, dtype=torch.float32, device_map="cpu", output_loading_info=True
    )
    m.eval()
    with torch.no_grad():
        lg = [m(torch.tensor([ids])).logits[0] for ids in build.LOGIT_PROBE]
    out = build.compare(fx, lg, what)
    out["loading_info"] = {k: sorted(v)[:12] for k, v in info.items() if v}
    return out


def main(argv: list[str]) -> None:
    stages = {"awq": build_awq, "ct": build_ct}
    if not argv or any(a not in stages for a in argv):
        sys.exit(f"usage: build_moe_awq_ct.py awq|ct, not {argv}")
    for stage in argv:
        work = Path(tempfile.mkdtemp(prefix=f"quant_moe_{stage}_"))
        os.chdir(work)  # gptqmodel writes its logs/ under the working directory: not in the repo
        try:
            print(f"== {stage}", flush=True)
            stages[stage](work)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
