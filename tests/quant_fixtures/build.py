# ruff: noqa: E501 - long provenance strings and install commands are kept whole
"""Builds the int4 quantized test fixtures with the formats' OWN tools (not with Switchyard code).

Each fixture directory tests/quant_fixtures/<name>/ holds:
  - the quantized checkpoint exactly as the tool saved it (config.json with quantization_config,
    model.safetensors with the packed tensors, the tool's side files), plus the tokenizer and the
    generation_config of the float source model (launcher/tiny_models.build_model);
  - reference/: the same model dequantized by the format's own library, saved as a plain float32
    transformers checkpoint (no quantization_config);
  - provenance.json: tool, version, function, parameters, library versions, and the checks run.
`verify` (plain transformers only) adds expected.json: fp32 greedy ids of reference/.

Tools live in two throwaway venvs (never the project's .venv), because llmcompressor pins an older
transformers and compressed-tensors than gptqmodel wants:

  # venv 1: gptqmodel 7.7.0 (GPTQ), autoawq 0.2.9 (AWQ GEMM), transformers 5.23.0, torch 2.13.0+cpu
  python3 -m venv /tmp/qtools
  /tmp/qtools/bin/pip install torch==2.13.0
  /tmp/qtools/bin/pip install transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0 \
      accelerate==1.15.0 compressed-tensors==0.20.0 optimum==2.3.0 datasets pillow requests protobuf \
      threadpoolctl device-smi pypcre tokenicer logbar jinja2 dill defuser
  /tmp/qtools/bin/pip install --no-deps gptqmodel==7.7.0 autoawq==0.2.9
  # venv 2: llmcompressor 0.14.0.1 + compressed-tensors 0.19.0 (pins transformers<=5.17.0)
  python3 -m venv /tmp/qllmc
  /tmp/qllmc/bin/pip install torch==2.13.0
  /tmp/qllmc/bin/pip install transformers==5.17.0 compressed-tensors==0.19.0 accelerate datasets \
      loguru pyyaml tqdm pillow nvidia-ml-py requests
  /tmp/qllmc/bin/pip install --no-deps llmcompressor==0.14.0.1 auto-round==0.15.1

Rebuild (from the repository root; each stage only rebuilds the fixtures of its tool):

  GPTQMODEL_CPU_WORKERS=2 /tmp/qtools/bin/python tests/quant_fixtures/build.py awq gptq
  /tmp/qllmc/bin/python tests/quant_fixtures/build.py ct
  .venv/bin/python tests/quant_fixtures/build.py verify

(GPTQMODEL_CPU_WORKERS=2: gptqmodel's thread pool refuses to start on a 2-core machine otherwise.)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

SHAPE = dict(
    vocab_size=320,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
LLAMA = "LlamaForCausalLM"
QWEN2 = "Qwen2ForCausalLM"
PHI3 = "Phi3ForCausalLM"
# Phi-4-mini style rotary: 3/4 of each 32-dim head rotated (head_dim = hidden / heads).
PHI3_ROPE = {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.75}

# name -> spec. tool: awq (AutoAWQ), gptq (gptqmodel), ct (llmcompressor / compressed-tensors).
FIXTURES: dict[str, dict] = {
    "awq_gemm_g64_llama": dict(tool="awq", arch=LLAMA, tie=False, seed=101, bits=4, group_size=64),
    "awq_gemm_g32_qwen2_tied": dict(
        tool="awq", arch=QWEN2, tie=True, seed=102, bits=4, group_size=32
    ),
    "gptq_g32_actorder_sym_llama": dict(
        tool="gptq",
        arch=LLAMA,
        tie=False,
        seed=103,
        bits=4,
        group_size=32,
        desc_act=True,
        sym=True,
        format="gptq",
    ),
    "gptq_g64_asym_qwen2_tied": dict(
        tool="gptq",
        arch=QWEN2,
        tie=True,
        seed=104,
        bits=4,
        group_size=64,
        desc_act=False,
        sym=False,
        format="gptq",
    ),
    "gptq_v2_g32_asym_llama": dict(
        tool="gptq",
        arch=LLAMA,
        tie=False,
        seed=105,
        bits=4,
        group_size=32,
        desc_act=False,
        sym=False,
        format="gptq_v2",
    ),
    "gptq_8bit_g32_sym_llama_tied": dict(
        tool="gptq",
        arch=LLAMA,
        tie=True,
        seed=106,
        bits=8,
        group_size=32,
        desc_act=False,
        sym=True,
        format="gptq",
    ),
    "gptq_g128_sym_llama": dict(
        tool="gptq",
        arch=LLAMA,
        tie=False,
        seed=107,
        bits=4,
        group_size=128,
        desc_act=False,
        sym=True,
        format="gptq",
    ),
    # Phi-3 checkpoints fuse q/k/v into one qkv_proj and gate/up into one gate_up_proj: each
    # tensor-parallel rank cuts its q, k and v columns (output features) out of one packed tensor.
    "gptq_g32_sym_phi3": dict(
        tool="gptq",
        arch=PHI3,
        tie=False,
        seed=110,
        bits=4,
        group_size=32,
        desc_act=False,
        sym=True,
        format="gptq",
        config=dict(rope_parameters=PHI3_ROPE),
    ),
    "ct_w4a16_group64_sym_llama": dict(
        tool="ct",
        arch=LLAMA,
        tie=False,
        seed=108,
        bits=4,
        group_size=64,
        strategy="group",
        symmetric=True,
    ),
    "ct_w4a16_channel_asym_qwen2_tied": dict(
        tool="ct",
        arch=QWEN2,
        tie=True,
        seed=109,
        bits=4,
        group_size=None,
        strategy="channel",
        symmetric=False,
    ),
}

N_CALIB = 32
PROMPTS = ["The quick brown fox", "Paged attention reads keys"]
LOGIT_PROBE = [[1, 5, 9, 30, 100, 200, 7, 64, 250, 3], [1, 42, 17, 300, 12]]


# ---------------------------------------------------------------- shared helpers


def _versions(*names: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for n in ("torch", "transformers", "safetensors", *names):
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            out[n] = None
    return out


def shape(spec: dict) -> dict:
    """SHAPE, with what the spec's `config` changes of it, then the rest of that config."""
    return {**SHAPE, **spec.get("config", {})}


def build_float(spec: dict, path: Path) -> Path:
    """The float32 source model, from the project's own tiny-model builder."""
    from launcher.tiny_models import build_model

    return build_model(
        path, spec["arch"], seed=spec["seed"], tie_word_embeddings=spec["tie"], **shape(spec)
    )


def calib_ids(float_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    from launcher.tiny_models import _corpus

    tok = AutoTokenizer.from_pretrained(float_dir)
    return [tok(t)["input_ids"][:64] for t in _corpus()[:N_CALIB]]


def finish_quant_dir(out: Path, float_dir: Path) -> None:
    """Tokenizer and generation_config of the float source; tools rewrite the latter (do_sample)."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(float_dir).save_pretrained(out)
    shutil.copy(float_dir / "generation_config.json", out / "generation_config.json")


QUANT_SUFFIXES = (
    "qweight",
    "qzeros",
    "scales",
    "g_idx",
    "weight_packed",
    "weight_scale",
    "weight_zero_point",
    "weight_shape",
    "weight_g_idx",
)


def write_reference(fx: Path, dequant: dict, restack=None) -> None:
    """reference/: fx's checkpoint with each quantized linear replaced by `dequant[prefix]`
    ((out, in) float32, computed by the format's own library), every other tensor cast to fp32;
    `restack(tensors, config)` first turns per-expert tensors into transformers' own layout."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    sd = load_file(fx / "model.safetensors")
    new = {}
    for k, v in sd.items():
        prefix, leaf = k.rsplit(".", 1)
        if prefix in dequant and leaf in QUANT_SUFFIXES:
            continue
        new[k] = v.to(torch.float32)
    for prefix, w in dequant.items():
        new[prefix + ".weight"] = w.to(torch.float32).contiguous()
    cfg = json.loads((fx / "config.json").read_text())
    cfg.pop("quantization_config")
    cfg["dtype"] = "float32"
    ref = fx / "reference"
    if ref.exists():
        shutil.rmtree(ref)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(cfg))
        config = AutoConfig.from_pretrained(tmp)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if restack is not None:
        restack(new, config)
    _fuse_split_gate_up(new, set(model.state_dict()))
    missing, unexpected = model.load_state_dict(new, strict=False)
    allowed_missing = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert not unexpected, unexpected
    assert set(missing) <= allowed_missing, missing
    if config.tie_word_embeddings:
        model.tie_weights()
    model.save_pretrained(ref)
    (ref / "generation_config.json").unlink(missing_ok=True)


def _fuse_split_gate_up(sd: dict, model_keys: set[str]) -> None:
    """gptqmodel 7.7.0 (through its `defuser` dependency) splits Phi-3's fused mlp.gate_up_proj
    into gate_proj and up_proj before quantizing, and saves them split. transformers' Phi-3 has
    one gate_up_proj whose first half of outputs is the gate (Phi3MLP: `gate, up = chunk(2)`),
    so reference/ holds cat([gate, up]) under that name: the same weights, transformers' name."""
    import torch

    for key in [k for k in sd if k.endswith(".mlp.gate_proj.weight")]:
        fused = key.replace(".gate_proj.", ".gate_up_proj.")
        up = key.replace(".gate_proj.", ".up_proj.")
        if fused in model_keys and key not in model_keys and up in sd:
            sd[fused] = torch.cat([sd.pop(key), sd.pop(up)]).contiguous()


def ref_logits(fx: Path):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(fx / "reference", dtype=torch.float32)
    m.eval()
    with torch.no_grad():
        return [m(torch.tensor([ids])).logits[0] for ids in LOGIT_PROBE]


def compare(fx: Path, other_logits: list, what: str) -> dict:
    import torch

    ref = ref_logits(fx)
    assert all(torch.isfinite(r).all() for r in ref), "reference logits not finite"
    diff = max((a - b.float()).abs().max().item() for a, b in zip(ref, other_logits, strict=True))
    scale = max(a.abs().max().item() for a in ref)
    argmax_same = all(
        torch.equal(a.argmax(-1), b.float().argmax(-1))
        for a, b in zip(ref, other_logits, strict=True)
    )
    print(
        f"  {fx.name}: {what}: max|dlogit|={diff:.3g} (max|logit|={scale:.3g}), argmax equal={argmax_same}"
    )
    return dict(
        against=what, max_abs_logit_diff=diff, max_abs_logit=scale, argmax_equal=argmax_same
    )


def float_vs_ref(fx: Path, float_dir: Path) -> dict:
    """How far quantization moved the model (sanity: not zero, not huge)."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32)
    with torch.no_grad():
        lg = [m(torch.tensor([ids])).logits[0] for ids in LOGIT_PROBE]
    return compare(fx, lg, "float32 source model before quantization (expect a small nonzero gap)")


def transformers_on_quant_dir(fx: Path, **kw) -> list:
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(fx, dtype=torch.float32, device_map="cpu", **kw)
    m.eval()
    with torch.no_grad():
        return [m(torch.tensor([ids])).logits[0] for ids in LOGIT_PROBE]


def write_provenance(fx: Path, prov: dict) -> None:
    (fx / "provenance.json").write_text(json.dumps(prov, indent=2, sort_keys=False) + "\n")


def base_provenance(name: str, spec: dict) -> dict:
    return dict(
        fixture=name,
        source_model=dict(
            builder="launcher/tiny_models.py build_model (normal init: std 0.05, embed/lm_head 0.08)",
            architecture=spec["arch"],
            tie_word_embeddings=spec["tie"],
            seed=spec["seed"],
            **shape(spec),
        ),
        calibration=f"{N_CALIB} lines of launcher/tiny_models._corpus(), tokenized by the fixture's "
        "tokenizer, at most 64 tokens each",
    )


# ---------------------------------------------------------------- AWQ (AutoAWQ)


def build_awq(name: str, spec: dict, work: Path) -> None:
    import torch
    from awq import AutoAWQForCausalLM
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from launcher.tiny_models import _corpus

    fx = HERE / name
    if fx.exists():
        shutil.rmtree(fx)
    float_dir = build_float(spec, work / name / "float")
    quant_config = {
        "zero_point": True,
        "q_group_size": spec["group_size"],
        "w_bit": spec["bits"],
        "version": "GEMM",
    }
    tok = AutoTokenizer.from_pretrained(float_dir)
    model = AutoAWQForCausalLM.from_pretrained(
        str(float_dir), torch_dtype=torch.float16, device_map="cpu"
    )
    model.quantize(
        tok,
        quant_config=quant_config,
        calib_data=_corpus()[:N_CALIB],
        max_calib_samples=N_CALIB,
        max_calib_seq_len=64,
    )
    model.save_quantized(str(fx))
    finish_quant_dir(fx, float_dir)

    # Reference: AutoAWQ's own unpacker (awq/utils/packing_utils.py dequantize_gemm), scales in fp32
    # so that scale * (q - z) is exact.
    sd = load_file(fx / "model.safetensors")
    dequant = {}
    for k in sd:
        if k.endswith(".qweight"):
            p = k[: -len(".qweight")]
            w = dequantize_gemm(
                sd[p + ".qweight"],
                sd[p + ".qzeros"],
                sd[p + ".scales"].float(),
                spec["bits"],
                spec["group_size"],
            )  # (in, out)
            dequant[p] = w.t()
    write_reference(fx, dequant)

    checks = [float_vs_ref(fx, float_dir)]
    # Independent reader: transformers' AWQ integration, which runs gptqmodel's AWQ kernels on CPU.
    checks.append(
        compare(
            fx,
            transformers_on_quant_dir(fx),
            "transformers AutoModelForCausalLM on the quantized dir (gptqmodel AWQ kernel)",
        )
    )

    import awq

    prov = base_provenance(name, spec)
    prov.update(
        tool=dict(name="autoawq", version=awq.__version__),
        function="awq.AutoAWQForCausalLM.from_pretrained(dtype fp16) -> .quantize(tok, quant_config, calib_data) "
        "(AwqQuantizer: activation-aware scale search + clipping, then WQLinear_GEMM.from_linear packs) "
        "-> .save_quantized()",
        parameters=dict(
            quant_config=quant_config,
            version="gemm",
            zero_point=True,
            bits=spec["bits"],
            group_size=spec["group_size"],
        ),
        reference=dict(
            function="awq.utils.packing_utils.dequantize_gemm(qweight, qzeros, scales.float(), bits, group_size).T",
            dtype="float32",
        ),
        versions=_versions("autoawq", "gptqmodel"),
        checks=checks,
    )
    write_provenance(fx, prov)


# ---------------------------------------------------------------- GPTQ (gptqmodel)


def build_gptq(name: str, spec: dict, work: Path) -> None:
    import gptqmodel
    import torch
    from gptqmodel import BACKEND, GPTQModel, QuantizeConfig
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear

    fx = HERE / name
    if fx.exists():
        shutil.rmtree(fx)
    float_dir = build_float(spec, work / name / "float")
    qkw = dict(
        bits=spec["bits"],
        group_size=spec["group_size"],
        desc_act=spec["desc_act"],
        sym=spec["sym"],
        format=spec["format"],
        act_group_aware=False,
        offload_to_disk=False,
    )
    qc = QuantizeConfig(**qkw)
    # gptqmodel's tokenizer helper (tokenicer) picks a pad token when the tokenizer has none; for
    # model_type qwen2 it adds '<|endoftext|>' at id == vocab_size, which breaks the embedding. The
    # tool gets a copy whose tokenizer names '<unk>' (id 0) as pad; the fixture keeps the original.
    tool_dir = work / name / "float_for_tool"
    shutil.copytree(float_dir, tool_dir)
    tcfg = json.loads((tool_dir / "tokenizer_config.json").read_text())
    tcfg["pad_token"] = "<unk>"
    (tool_dir / "tokenizer_config.json").write_text(json.dumps(tcfg))
    model = GPTQModel.load(str(tool_dir), qc, dtype=torch.float16)
    calib = [{"input_ids": ids, "attention_mask": [1] * len(ids)} for ids in calib_ids(float_dir)]
    model.quantize(calib, batch_size=1)
    model.save(str(fx))
    del model
    finish_quant_dir(fx, float_dir)

    # Reference: gptqmodel's own unpacker. Load the saved dir with the pure-torch kernel (which
    # converts v1 zeros to its internal v2 convention on load, as for any gptq checkpoint) and call
    # each quantized module's dequantize_weight() with fp32 scales (exact scale * (q - z)).
    qm = GPTQModel.load(str(fx), backend=BACKEND.GPTQ_TORCH, device="cpu", dtype=torch.float16)
    dequant = {}
    tool_logits = []
    with torch.no_grad():
        for mname, mod in qm.model.named_modules():
            if isinstance(mod, BaseQuantLinear):
                scales = mod.scales
                mod.scales = scales.float()
                dequant[mname] = mod.dequantize_weight().t().float()  # (in, out) -> (out, in)
                mod.scales = scales
        for ids in LOGIT_PROBE:
            tool_logits.append(qm.model(torch.tensor([ids])).logits[0].float())
    kernel = sorted(
        {type(m).__name__ for m in qm.model.modules() if isinstance(m, BaseQuantLinear)}
    )
    del qm
    write_reference(fx, dequant)

    checks = [float_vs_ref(fx, float_dir)]
    checks.append(
        compare(
            fx, tool_logits, f"gptqmodel GPTQModel.load(backend=gptq_torch) fp16 forward ({kernel})"
        )
    )
    try:
        checks.append(
            compare(
                fx,
                transformers_on_quant_dir(fx),
                "transformers AutoModelForCausalLM fp32 on the quantized dir (optimum + gptqmodel auto kernel)",
            )
        )
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        checks.append(dict(against="transformers on the quantized dir", error=repr(e)[:500]))
        print("  transformers on quant dir failed:", repr(e)[:300])

    prov = base_provenance(name, spec)
    prov.update(
        tool=dict(name="gptqmodel", version=gptqmodel.__version__),
        function="gptqmodel.GPTQModel.load(float_dir, QuantizeConfig(...), dtype=float16) -> .quantize(calib) -> .save()",
        parameters=dict(
            bits=spec["bits"],
            group_size=spec["group_size"],
            desc_act=spec["desc_act"],
            sym=spec["sym"],
            checkpoint_format=spec["format"],
            act_group_aware=False,
            pack_dtype="int32",
            damp_percent=0.05,
            true_sequential=True,
            lm_head_quantized=False,
        ),
        reference=dict(
            function="gptqmodel GPTQModel.load(quant_dir, backend=BACKEND.GPTQ_TORCH); per quant module: "
            "dequantize_weight() (gptqmodel/nn_modules/qlinear/__init__.py PackableQuantLinear) with scales cast to fp32, transposed",
            dtype="float32",
        ),
        versions=_versions("gptqmodel", "optimum"),
        notes="gptqmodel 7.7.0 requires torch>=2.14.1 on paper; installed with --no-deps on torch 2.13.0+cpu and ran on CPU.",
        checks=checks,
    )
    if spec["arch"] == PHI3:
        prov["notes"] = [
            prov["notes"],
            "gptqmodel 7.7.0 (its defuser 0.0.28 dependency patches transformers' Phi3MLP) splits "
            "Phi-3's fused mlp.gate_up_proj into mlp.gate_proj + mlp.up_proj before quantizing and "
            "saves them split; self_attn.qkv_proj stays one fused, packed tensor "
            "(q rows 0:128, k 128:192, v 192:256 of its 256 output features).",
            "reference/ stores cat([gate_proj, up_proj]) as mlp.gate_up_proj.weight, the name and "
            "order transformers' Phi3MLP uses (gate = first half of its outputs).",
            "Plain transformers (+ optimum + gptqmodel) cannot load the quantized dir: its Phi3MLP "
            "expects gate_up_proj.{qweight,qzeros,scales,g_idx}, reports the split tensors as "
            "UNEXPECTED and leaves gate_up_proj uninitialised (the recorded error).",
        ]
    write_provenance(fx, prov)


# ---------------------------------------------------------------- compressed-tensors (llmcompressor)


def build_ct(name: str, spec: dict, work: Path) -> None:
    import compressed_tensors
    import llmcompressor
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from transformers import AutoModelForCausalLM

    fx = HERE / name
    if fx.exists():
        shutil.rmtree(fx)
    float_dir = build_float(spec, work / name / "float")
    model = AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float16)
    weights = dict(
        num_bits=spec["bits"], type="int", symmetric=spec["symmetric"], strategy=spec["strategy"]
    )
    if spec["group_size"] is not None:
        weights["group_size"] = spec["group_size"]
    config_groups = {"group_0": {"targets": ["Linear"], "weights": weights}}
    recipe = GPTQModifier(config_groups=config_groups, ignore=["lm_head"])
    ds = Dataset.from_dict({"input_ids": calib_ids(float_dir)})
    oneshot(
        model=model, dataset=ds, recipe=recipe, max_seq_length=64, num_calibration_samples=N_CALIB
    )
    model.save_pretrained(fx, save_compressed=True)
    del model
    finish_quant_dir(fx, float_dir)

    write_reference(fx, ct_dequantized(fx))

    checks = [float_vs_ref(fx, float_dir)]
    try:
        checks.append(
            compare(
                fx,
                transformers_on_quant_dir(fx),
                "transformers AutoModelForCausalLM fp32 on the quantized dir (compressed-tensors quantizer)",
            )
        )
    except Exception as e:  # noqa: BLE001
        checks.append(dict(against="transformers on the quantized dir", error=repr(e)[:500]))
        print("  transformers on quant dir failed:", repr(e)[:300])

    prov = base_provenance(name, spec)
    prov.update(
        tool=dict(
            name="llmcompressor",
            version=llmcompressor.__version__,
            compressed_tensors=compressed_tensors.__version__,
        ),
        function="llmcompressor.oneshot(model(fp16), dataset, recipe=GPTQModifier(config_groups, ignore=['lm_head'])) "
        "-> model.save_pretrained(save_compressed=True) (ModelCompressor -> PackedQuantizationCompressor.compress)",
        parameters=dict(
            config_groups=config_groups,
            ignore=["lm_head"],
            format="pack-quantized",
            strategy=spec["strategy"],
            symmetric=spec["symmetric"],
            group_size=spec["group_size"],
            bits=spec["bits"],
        ),
        reference=dict(
            function="compressed_tensors.compressors.pack_quantized.base.PackedQuantizationCompressor.decompress"
            "({weight_packed, weight_scale.float(), weight_zero_point, weight_shape}, scheme)['weight']",
            dtype="float32",
        ),
        versions=_versions("llmcompressor", "compressed-tensors"),
        checks=checks,
    )
    write_provenance(fx, prov)


def ct_dequantized(fx: Path) -> dict:
    """Every pack-quantized module of fx, decompressed by compressed-tensors' own decompressor
    for the saved format (PackedQuantizationCompressor.decompress: unpack_from_int32 +
    dequantize), scales in fp32: {prefix: (out, in) fp32}."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file

    cfg = json.loads((fx / "config.json").read_text())["quantization_config"]
    qcfg = QuantizationConfig.model_validate(cfg)
    assert qcfg.format == "pack-quantized", qcfg.format
    scheme = qcfg.config_groups["group_0"]
    sd = load_file(fx / "model.safetensors")
    dequant = {}
    for k in sd:
        if k.endswith(".weight_packed"):
            p = k[: -len(".weight_packed")]
            local = {
                s: sd[f"{p}.{s}"]
                for s in ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")
                if f"{p}.{s}" in sd
            }
            local["weight_scale"] = local["weight_scale"].float()
            dequant[p] = PackedQuantizationCompressor.decompress(local, scheme)["weight"].float()
    return dequant


# ---------------------------------------------------------------- layouts (plain torch)


def _fields(x, bits: int, n: int):
    """(..., n): the n bit-fields of width `bits` of int32 `x`, field i at bits [bits*i, bits*i+bits)."""
    import torch

    sh = torch.arange(n, dtype=torch.int32) * bits
    return (x.unsqueeze(-1) >> sh) & ((1 << bits) - 1)


# Mixtral's experts as gptqmodel saves them (mlp.experts.{e}.gate_proj ...) -> as transformers
# saves reference/ (the Hub's block_sparse_moe.experts.{e}.w1 ...)
HUB_EXPERT_LEAVES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def hub_expert_name(prefix: str) -> str:
    """`model.layers.0.mlp.experts.3.gate_proj` -> `model.layers.0.block_sparse_moe.experts.3.w1`
    (other names unchanged)."""
    head, _, leaf = prefix.rpartition(".")
    if ".mlp.experts." not in head or leaf not in HUB_EXPERT_LEAVES:
        return prefix
    return (
        f"{head.replace('.mlp.experts.', '.block_sparse_moe.experts.')}.{HUB_EXPERT_LEAVES[leaf]}"
    )


def _reference_weight(ref: dict, prefix: str):
    """reference/'s (out, in) weight of quantized module `prefix`; a split gate_proj / up_proj
    (gptqmodel's Phi-3) is the first / second half of reference/'s fused gate_up_proj."""
    if prefix + ".weight" in ref:
        return ref[prefix + ".weight"]
    hub = hub_expert_name(prefix)
    if hub + ".weight" in ref:
        return ref[hub + ".weight"]
    for half, leaf in enumerate(("gate_proj", "up_proj")):
        if prefix.endswith("." + leaf):
            fused = ref[prefix[: -len(leaf)] + "gate_up_proj.weight"]
            return fused.chunk(2)[half]
    raise KeyError(prefix)


# Served fixtures that build_moe.py and build_moe_awq_ct.py build (reference/ included); `verify`
# checks them too.
BUILT_BY_MOE = (
    "gptq_g32_sym_mixtral",
    "gptq_g32_sym_qwen3_moe",
    "gptq_g32_sym_qwen3_moe_float_experts",
    "awq_gemm_g32_qwen3_moe",
    "ct_w4a16_group32_asym_qwen3_moe",
)
# FP8 fixtures that build_fp8.py builds: `verify` writes their expected.json; their layouts are
# checked by build_fp8.py's own `verify` (layouts() here knows only the int4 ones).
BUILT_BY_FP8 = (
    "ct_fp8_dynamic_llama",
    "ct_fp8_static_qwen2_tied",
    "ct_fp8_block_qwen3",
    "hf_fp8_block_phi3",
    "hf_fp8_block_qwen3_moe",
)


def _selected(verifying: bool = False) -> list[str]:
    only = os.environ.get("ONLY")  # optional: comma-separated fixture names
    names = [*FIXTURES, *(BUILT_BY_MOE + BUILT_BY_FP8 if verifying else ())]
    return [n for n in names if not only or n in only.split(",")]


def layouts() -> None:
    """Unpacks every fixture with the layouts stated in README.md (plain torch, none of the tools'
    code) and checks the result equals reference/ exactly: the README's description is what the
    tools wrote."""
    import torch
    from safetensors.torch import load_file

    for name in _selected(verifying=True):
        if name in BUILT_BY_FP8:
            continue
        fx = HERE / name
        q = load_file(fx / "model.safetensors")
        r = load_file(fx / "reference" / "model.safetensors")
        cfg = json.loads((fx / "config.json").read_text())["quantization_config"]
        worst = 0.0
        for k in q:
            if not k.endswith((".qweight", ".weight_packed")):
                continue
            p = k.rsplit(".", 1)[0]
            if cfg["quant_method"] == "awq":
                g = cfg["group_size"]
                order = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])  # field i holds column 8j + order[i]
                inv = torch.empty(8, dtype=torch.long)
                inv[order] = torch.arange(8)
                iw = _fields(q[p + ".qweight"], 4, 8)[..., inv].flatten(1)  # (in, out)
                iz = _fields(q[p + ".qzeros"], 4, 8)[..., inv].flatten(1)  # (in/g, out)
                s = q[p + ".scales"].float()  # (in/g, out)
                w = ((iw - iz.repeat_interleave(g, 0)) * s.repeat_interleave(g, 0)).t()
            elif cfg["quant_method"] == "gptq":
                b = cfg["bits"]
                n = 32 // b
                iw = _fields(q[p + ".qweight"], b, n).permute(0, 2, 1).flatten(0, 1)  # (in, out)
                iz = _fields(q[p + ".qzeros"], b, n).flatten(1)  # (ngroups, out)
                off = 1 if cfg["checkpoint_format"] == "gptq" else 0  # v1 stores zero - 1
                gi = q[p + ".g_idx"].long()
                s = q[p + ".scales"].float()
                w = ((iw - (iz[gi] + off)) * s[gi]).t()
            else:
                out, inn = q[p + ".weight_shape"].tolist()
                iw = _fields(q[p + ".weight_packed"], 4, 8).flatten(1)[:, :inn] - 8  # signed
                s = q[p + ".weight_scale"].float()  # (out, ngroups)
                gsz = inn // s.shape[1]
                zp = torch.zeros_like(s)
                if p + ".weight_zero_point" in q:  # packed along dim 0 (output rows)
                    zp = (
                        _fields(q[p + ".weight_zero_point"], 4, 8)
                        .permute(0, 2, 1)
                        .flatten(0, 1)[:out]
                        - 8
                    )
                w = (iw - zp.repeat_interleave(gsz, 1)) * s.repeat_interleave(gsz, 1)
            worst = max(worst, (w - _reference_weight(r, p)).abs().max().item())
        assert worst == 0.0, (name, worst)
        print(f"{name}: README layout unpack == reference exactly")


# ---------------------------------------------------------------- verify (plain transformers)


def verify() -> None:
    """Plain transformers fp32 on every reference/: finite logits, and expected.json greedy ids."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in _selected(verifying=True):
        fx = HERE / name
        if not (fx / "reference").exists():
            print(f"{name}: missing")
            continue
        cfg = json.loads((fx / "reference" / "config.json").read_text())
        assert "quantization_config" not in cfg
        m, info = AutoModelForCausalLM.from_pretrained(
            fx / "reference", dtype=torch.float32, output_loading_info=True
        )
        tied = {"lm_head.weight"} if cfg.get("tie_word_embeddings") else set()
        assert not info["unexpected_keys"], (name, info["unexpected_keys"])
        assert set(info["missing_keys"]) <= tied, (name, info["missing_keys"])
        m.eval()
        tok = AutoTokenizer.from_pretrained(fx)
        out = {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "dtype": "float32",
            "max_new_tokens": 8,
            "greedy": [],
        }
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                logits = m(ids).logits
                assert torch.isfinite(logits).all(), name
                gen = m.generate(
                    ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
                )
            out["greedy"].append(
                dict(
                    prompt=prompt,
                    prompt_ids=ids[0].tolist(),
                    new_ids=gen[0, ids.shape[1] :].tolist(),
                    last_logits_top5=torch.topk(logits[0, -1], 5).indices.tolist(),
                )
            )
        (fx / "expected.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"{name}: reference finite, expected.json {[g['new_ids'] for g in out['greedy']]}")


def main(argv: list[str]) -> None:
    stages = argv or ["awq", "gptq", "ct"]
    if "verify" in stages:
        layouts()
        verify()
        return
    builders = {"awq": build_awq, "gptq": build_gptq, "ct": build_ct}
    build_stages(stages, _selected(), FIXTURES, builders, "quant_fixtures_")


def build_stages(stages, names, fixtures: dict, builders: dict, prefix: str) -> None:
    """Builds each of `names` whose tool is one of `stages`, in a scratch directory."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        for name in names:
            spec = fixtures[name]
            if spec["tool"] not in stages:
                continue
            print(f"== {name} ({spec['tool']})", flush=True)
            builders[spec["tool"]](name, spec, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
