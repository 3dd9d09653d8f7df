"""Broken or unsupported int4 checkpoints fail at load, naming the tensor or the config field;
GPTQ's per-module `dynamic` rules are read as gptqmodel reads them, or refused naming the rule."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from quant_fixtures import CPU, fixture
from safetensors.torch import load_file, save_file

from shard.distributed import Distributed
from shard.layers.quant.config import QuantizationConfigError, parse_quantization_config
from shard.models import load_model
from shard.weights import WeightsError

AWQ, GPTQ, CT = "awq_gemm_g64_llama", "gptq_g64_asym_qwen2_tied", "ct_w4a16_group64_sym_llama"
LAYER = "model.layers.1"


def copy(name: str, tmp_path: Path, *, config=None, tensors=None) -> Path:
    """The fixture with its config and/or tensors changed by the given functions."""
    out = tmp_path / name
    shutil.copytree(fixture(name), out, ignore=shutil.ignore_patterns("reference"))
    if config:
        data = json.loads((out / "config.json").read_text())
        config(data["quantization_config"])
        (out / "config.json").write_text(json.dumps(data))
    if tensors:
        state = load_file(out / "model.safetensors")
        tensors(state)
        save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


def load(path: Path):
    return load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        (AWQ, "self_attn.o_proj.qzeros"),
        (AWQ, "mlp.up_proj.scales"),
        (GPTQ, "mlp.down_proj.qzeros"),
        (CT, "self_attn.k_proj.weight_scale"),
    ],
)
def test_missing_tensor_is_named(tmp_path, name, missing):
    path = copy(name, tmp_path, tensors=lambda s: s.pop(f"{LAYER}.{missing}"))
    with pytest.raises(WeightsError, match=rf"missing tensor '{LAYER}\.{missing}'"):
        load(path)


def test_group_size_that_disagrees_with_the_tensors_is_named(tmp_path):
    path = copy(AWQ, tmp_path, config=lambda q: q.update(group_size=32))
    with pytest.raises(WeightsError, match=r"q_proj\.qzeros has shape \[2, 16\].*imply \[4, 16\]"):
        load(path)


def test_scales_with_a_wrong_shape_are_named(tmp_path):
    def cut(state):
        name = f"{LAYER}.mlp.gate_proj.scales"
        state[name] = state[name][:, :-8].contiguous()

    with pytest.raises(WeightsError, match=r"gate_proj\.scales has shape \[2, 248\]"):
        load(copy(AWQ, tmp_path, tensors=cut))


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"quant_method": "awq", "bits": 3, "group_size": 64}, "bits = 3"),
        ({"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemv"}, "'gemv'"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 12}, "group_size = 12"),
        ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "'marlin'"),
        ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'"),
        (
            {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"},
            "'nvfp4-pack-quantized'",
        ),
    ],
)
def test_unsupported_config_names_the_field(raw, field):
    with pytest.raises(QuantizationConfigError, match=field):
        parse_quantization_config(raw)


def test_an_8bit_checkpoint_is_refused_by_name():
    with pytest.raises(QuantizationConfigError, match="bits = 8 is not supported for gptq"):
        load(fixture("gptq_8bit_g32_sym_llama_tied"))


def test_act_order_without_g_idx_is_named(tmp_path):
    path = copy(
        "gptq_g32_actorder_sym_llama",
        tmp_path,
        tensors=lambda s: s.pop(f"{LAYER}.mlp.up_proj.g_idx"),
    )
    with pytest.raises(WeightsError, match=rf"missing tensor '{LAYER}\.mlp\.up_proj\.g_idx'"):
        load(path)


GPTQ_G32 = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True, "desc_act": False}
EXPERTS = {"-:.*\\.experts\\..*": {}}  # gptqmodel's MoE recipe: routed experts left in fp16
EXPERT_0_KEPT = {"+:.*\\.experts\\.0\\.": {"bits": 4, "group_size": 32}, "-:.*\\.experts": {}}
L1 = "model.layers.1"


@pytest.mark.parametrize(
    ("dynamic", "module", "quantized"),
    [
        (EXPERTS, f"{L1}.mlp.experts.3.down_proj", False),
        (EXPERTS, f"{L1}.mlp.experts.gate_up_proj", False),  # transformers 5's stacked parameter
        (EXPERTS, f"{L1}.self_attn.q_proj", True),
        (EXPERTS, f"{L1}.mlp.gate", True),  # the router
        (EXPERTS, f"{L1}.mlp.shared_expert.down_proj", True),
        # re.match: anchored at the start of the name, not at its end, and not a search
        ({"-:model\\.layers\\.1\\.": {}}, f"{L1}.mlp.down_proj", False),
        ({"-:model\\.layers\\.1\\.": {}}, "model.layers.11.mlp.down_proj", True),
        ({"-:layers\\.1\\.": {}}, f"{L1}.mlp.down_proj", True),
        ({"-:lm_head": {}}, "lm_head_2", False),
        ({"-:^lm_head$": {}}, "lm_head_2", True),
        ({"-:a|.*o_proj": {}}, f"{L1}.self_attn.o_proj", False),  # the alternation stays whole
        # The first rule that matches decides: a positive rule before a negative one keeps the
        # modules it matches quantized; after it, it changes nothing.
        (EXPERT_0_KEPT, f"{L1}.mlp.experts.0.up_proj", True),
        (EXPERT_0_KEPT, f"{L1}.mlp.experts.1.up_proj", False),
        (dict(reversed(EXPERT_0_KEPT.items())), f"{L1}.mlp.experts.0.up_proj", False),
    ],
)
def test_gptq_dynamic_leaves_unquantized_what_gptqmodel_leaves(dynamic, module, quantized):
    """gptqmodel decides a module by its first matching rule, by `re.match` (its own
    `_resolve_dynamic_override`; these cases agree with its `dynamic_get`)."""
    config = parse_quantization_config({**GPTQ_G32, "dynamic": dynamic})
    assert config.quantizes(module) is quantized


def test_gptq_dynamic_keeps_modules_to_not_convert_and_the_settings():
    config = parse_quantization_config(
        {**GPTQ_G32, "dynamic": EXPERTS, "modules_to_not_convert": ["mlp.gate"]}
    )
    plain = parse_quantization_config(GPTQ_G32)
    assert config.group_size == 32 and not config.zero_point and not config.desc_act
    assert not config.quantizes(f"{L1}.mlp.gate")
    assert not config.quantizes(f"{L1}.mlp.experts.0.up_proj")
    # A positive rule that restates every global setting changes nothing.
    same = {"+:.*": {"bits": 4, "group_size": 32, "sym": True, "desc_act": False}}
    assert parse_quantization_config({**GPTQ_G32, "dynamic": same}) == plain


@pytest.mark.parametrize(
    ("dynamic", "message"),
    [
        ({"+:.*down_proj": {"bits": 8}}, "dynamic['+:.*down_proj'] sets bits = 8, but "
         "quantization_config.bits is 4: per-module GPTQ settings are not supported"),
        ({".*down_proj": {"group_size": 128}}, "dynamic['.*down_proj'] sets group_size = 128, "
         "but quantization_config.group_size is 32"),  # no prefix: a positive rule
        ({**EXPERTS, "+:.*q_proj": {"sym": False}}, "dynamic['+:.*q_proj'] sets sym = False, "
         "but quantization_config.sym is True"),
        ({"+:.*": {"desc_act": True}}, "dynamic['+:.*'] sets desc_act = True, but "),
        ({"+:.*": {"damp_percent": 0.1}}, "dynamic['+:.*'] sets damp_percent = 0.1: "
         "per-module GPTQ settings are not supported (only '-:' rules"),
        ({"-:.*experts(": {}}, "dynamic['-:.*experts(']: not a regular expression"),
        ({"+:.*": 4}, "dynamic['+:.*'] must be an object of settings"),
    ],
)  # fmt: skip
def test_gptq_dynamic_overrides_are_refused_naming_the_rule_and_the_setting(dynamic, message):
    with pytest.raises(QuantizationConfigError) as err:
        parse_quantization_config({**GPTQ_G32, "dynamic": dynamic})
    assert str(err.value).startswith(f"quantization_config.{message}")
