"""An int4 Mixture-of-Experts checkpoint as gptqmodel writes it (tests/quant_fixtures/
gptq_g32_sym_qwen3_moe: attention and every routed expert quantized, the router kept in fp16; see
build_moe.py) is served with its experts kept int4, against transformers on its reference/
(gptqmodel's own dequantization), on one shard and per rank of two, tensor and expert parallel
(the two ranks' sums: tests/shard/test_tensor_parallel.py; the Triton kernel on it:
tests/kernels/test_quantized_triton.py). The launcher's split check counts the experts'
intermediate size where they are int4 and split by it (tensor parallel), not under
--expert-parallel, nor where they are floating point.

The same recipe with gptqmodel's `dynamic` rule that leaves the experts in fp16
(gptq_g32_sym_qwen3_moe_float_experts, int4 attention) serves too, its experts in fp16 as saved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from paged_helpers import assert_equals_reference, run_paged
from quant_fixtures import (
    CPU,
    SERVED,
    SERVED_MOE,
    checkpoint_keys,
    fixture,
    quant_config,
    reference_weights,
)
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import launcher.main as launcher_main
from launcher.quant_checks import QuantizationCheckError, check_quantization
from shard.distributed import Distributed
from shard.layers.moe import FusedMoE
from shard.layers.quant.config import parse_quantization_config
from shard.layers.quant.int4_cpu import CpuInt4
from shard.layers.quant.int4_dequant import DequantizingInt4
from shard.models import load_model
from shard.weights import WeightsError

MOE = "gptq_g32_sym_qwen3_moe"
FLOAT_EXPERTS = "gptq_g32_sym_qwen3_moe_float_experts"
# The fixtures whose routed experts are int4: gptqmodel's GPTQ and AWQ, llm-compressor's W4A16
INT4_EXPERTS = [
    n
    for n in SERVED_MOE
    if "model.layers.0.mlp.experts.0.down_proj.weight" not in checkpoint_keys(n)
]
# test_quantized_models.py's: fp32 against the library-dequantized model in transformers.
STEPS, ATOL = 4, 1e-4
GATE_UP = ("gate_proj", "up_proj")


def load(path: Path, rank: int = 0, world: int = 1, expert_parallel: bool = False):
    dist = Distributed(rank=rank, world_size=world)
    return load_model(
        path, dtype=torch.float32, device=CPU, dist=dist, expert_parallel=expert_parallel
    )


@pytest.mark.parametrize("name", INT4_EXPERTS)
def test_the_tools_quantized_the_experts_and_kept_the_router_in_floating_point(name):
    """The premise of the serving tests below: every routed expert packed as its format
    packs (GPTQ and AWQ by gptqmodel, compressed-tensors by llm-compressor), the router not."""
    keys, method = checkpoint_keys(name), quant_config(name)["quant_method"]
    packed = "weight_packed" if method == "compressed-tensors" else "qweight"
    for layer in (0, 1):
        for expert in range(4):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                module = f"model.layers.{layer}.mlp.experts.{expert}.{proj}"
                assert f"{module}.{packed}" in keys and f"{module}.weight" not in keys
        assert f"model.layers.{layer}.self_attn.q_proj.{packed}" in keys
        assert f"model.layers.{layer}.mlp.gate.weight" in keys
    assert name not in SERVED


def test_every_format_has_an_int4_experts_fixture():
    methods = {quant_config(name)["quant_method"] for name in INT4_EXPERTS}
    assert methods == {"gptq", "awq", "compressed-tensors"} and MOE in INT4_EXPERTS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", INT4_EXPERTS)
def test_int4_experts_stay_int4_one_platform_linear_per_expert(name, dtype):
    """Off the Triton kernel each expert is an int4 linear of the platform's: torch's CPU int4
    kernel for bf16 (group 32 is one it takes), dequantizing a slice at a time for fp32. No
    floating-point copy of any expert is kept."""
    ours = load_model(fixture(name), dtype=dtype, device=CPU, dist=Distributed())
    kind = CpuInt4 if dtype == torch.bfloat16 else DequantizingInt4
    for layer in ours.layers:
        experts = layer.mlp.experts
        assert isinstance(experts, FusedMoE) and len(experts.w13) == len(experts.w2) == 4
        assert all(type(w) is kind for w in [*experts.w13, *experts.w2])
        assert not any(p.is_floating_point() for p in experts.parameters())
        floats = [b for b in experts.buffers() if b.is_floating_point() and b.numel() > 64 * 4]
        assert all(b.shape[0] <= 4 for b in floats)  # scales per group, not weights
    # the first layer's experts on a decode-sized and a prefill-sized step against gptqmodel's
    # dequantized weights, in float64: bf16's error (its rounded scales and activations)
    ref = reference_weights(name)
    experts = ours.layers[0].mlp.experts
    gen = torch.Generator().manual_seed(4)
    for tokens in (1, 400):  # ~200 rows an expert: the dense path past DENSE_MIN_ROWS
        x = torch.randn(tokens, 128, generator=gen).to(dtype)
        ids = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(tokens)]).int()
        weights = torch.softmax(torch.randn(tokens, 2, generator=gen), -1)
        got = experts(x, weights, ids)
        want = _experts_reference(ref, "model.layers.0.mlp", x, weights, ids)
        tolerance = 2e-2 * want.abs().max().item() if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(got.double(), want, atol=tolerance, rtol=0)


def _experts_reference(ref, mlp: str, x, weights, ids) -> torch.Tensor:
    """sum over k of weights[t, k] * down_e(silu(gate_e x) * up_e x), e = ids[t, k], float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e, row = int(ids[t, k]), x[t].double()
            w = {p: ref[f"{mlp}.experts.{e}.{p}.weight"].double() for p in (*GATE_UP, "down_proj")}
            hidden = torch.nn.functional.silu(w["gate_proj"] @ row) * (w["up_proj"] @ row)
            out[t] += weights[t, k].double() * (w["down_proj"] @ hidden)
    return out


def test_a_quantized_router_is_refused_naming_it(tmp_path):
    """The fixture with float experts and its router's weight swapped for GPTQ tensors (only
    their presence matters: the router is refused before any is read)."""
    out = tmp_path / MOE
    shutil.copytree(fixture(MOE), out)
    state = load_file(out / "model.safetensors")
    for key in [k for k in state if ".mlp.experts." in k]:
        module, leaf = key.rsplit(".", 1)
        del state[key]
        if leaf == "qweight":  # a float weight of the expert's shape, (out, in)
            shape = (128, 64) if module.endswith("down_proj") else (64, 128)
            state[f"{module}.weight"] = torch.zeros(shape, dtype=torch.float16)
    router = state.pop("model.layers.0.mlp.gate.weight")
    state["model.layers.0.mlp.gate.qweight"] = torch.zeros((16, 4), dtype=torch.int32)
    state["model.layers.0.mlp.gate.scales"] = torch.ones((4, 4), dtype=router.dtype)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"gptq int4 model\.layers\.0\.mlp\.gate is not supp"):
        load(out)


# -- int4 attention, floating-point experts: served ---------------------------------------


def test_gptqmodel_left_the_experts_in_floating_point_by_its_dynamic_rule():
    """The premise of the serving tests below: gptqmodel's MoE recipe saved every routed expert
    as an fp16 `.weight`, attention as GPTQ, and our config reads its rule as gptqmodel does."""
    assert FLOAT_EXPERTS in SERVED_MOE and FLOAT_EXPERTS not in SERVED
    raw = quant_config(FLOAT_EXPERTS)
    assert raw["dynamic"] == {"-:.*\\.experts\\..*": {}}
    config, keys = parse_quantization_config(raw), checkpoint_keys(FLOAT_EXPERTS)
    for layer in (0, 1):
        for expert in range(4):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                module = f"model.layers.{layer}.mlp.experts.{expert}.{proj}"
                assert f"{module}.weight" in keys and f"{module}.qweight" not in keys
                assert not config.quantizes(module)
        for proj in "qkvo":
            module = f"model.layers.{layer}.self_attn.{proj}_proj"
            assert f"{module}.qweight" in keys and config.quantizes(module)


def _prompts(vocab_size: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab_size, (n,), generator=gen) for n in (19, 33)]


@pytest.mark.parametrize("name", SERVED_MOE)
def test_logits_and_greedy_ids_match_transformers_on_the_library_dequantized_model(name):
    ours = load(fixture(name))
    for layer in ours.layers:
        attn, experts = layer.self_attn, layer.mlp.experts
        assert isinstance(attn.qkv_proj.weight, DequantizingInt4)
        assert isinstance(attn.o_proj.weight, DequantizingInt4)
        if name in INT4_EXPERTS:
            assert isinstance(experts.w13[0], DequantizingInt4)
        else:
            assert isinstance(experts, FusedMoE) and experts.w13.dtype == torch.float32
    ref = AutoModelForCausalLM.from_pretrained(fixture(name) / "reference", dtype=torch.float32)
    batch = _prompts(ours.vocab_size)
    logits, tokens = run_paged(ours, batch, STEPS, seed=3)
    assert_equals_reference(ref, batch, logits, tokens, ATOL)


def _dense(linear) -> torch.Tensor:
    """An int4 linear's weight, dequantized: its matmul applied to the identity, (out, in)."""
    return _dense_weight(linear.weight)


def _dense_weight(weight) -> torch.Tensor:
    return weight(torch.eye(weight.in_features)).T


def _experts_dense(experts) -> tuple[torch.Tensor, torch.Tensor]:
    """w13 and w2 stacked as floating point: int4 experts' weights dequantized."""
    if isinstance(experts.w13, torch.Tensor):
        return experts.w13, experts.w2
    return tuple(torch.stack([_dense_weight(w) for w in ws]) for ws in (experts.w13, experts.w2))


@pytest.mark.parametrize("name", SERVED_MOE)
@pytest.mark.parametrize(
    ("rank", "world", "expert_parallel"),
    [(0, 1, False), (1, 2, False), (1, 2, True)],
    ids=["one-shard", "tensor-parallel-rank-1", "expert-parallel-rank-1"],
)
def test_each_rank_holds_exactly_its_slice_of_the_reference(name, rank, world, expert_parallel):
    """Attention: its q/k/v heads and o_proj input columns, int4, equal to gptqmodel's
    dequantization; experts: every expert's intermediate slice (tensor parallel) or its experts
    whole (expert parallel): the checkpoint's fp16 exactly, or gptqmodel's dequantization of
    its int4 exactly."""
    ref = reference_weights(name)
    ours = load(fixture(name), rank, world, expert_parallel)
    num_experts = 4
    for i, layer in enumerate(ours.layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        qkv = torch.cat([ref[f"{attn}.{p}_proj.weight"].chunk(world)[rank] for p in "qkv"])
        assert torch.equal(_dense(layer.self_attn.qkv_proj), qkv)
        o = ref[f"{attn}.o_proj.weight"].chunk(world, dim=1)[rank]
        assert torch.equal(_dense(layer.self_attn.o_proj), o)
        if expert_parallel:  # this rank's experts, whole
            per_rank = num_experts // world
            experts, part, parts = range(rank * per_rank, (rank + 1) * per_rank), 0, 1
        else:  # every expert, this rank's part of its intermediate dimension
            experts, part, parts = range(num_experts), rank, world
        gate_up = [
            torch.cat([ref[f"{mlp}.experts.{e}.{p}.weight"].chunk(parts)[part] for p in GATE_UP])
            for e in experts
        ]
        down = [ref[f"{mlp}.experts.{e}.down_proj.weight"].chunk(parts, 1)[part] for e in experts]
        w13, w2 = torch.stack(gate_up), torch.stack(down)
        ours13, ours2 = _experts_dense(layer.mlp.experts)
        assert torch.equal(ours13, w13) and torch.equal(ours2, w2)


# -- the launcher ------------------------------------------------------------------------


def test_the_launcher_splits_int4_experts_on_their_groups_unless_expert_parallel():
    """Expert intermediate 64, group 32: each expert's down_proj inputs split on group
    boundaries across 1 or 2 shards, not 4 (16 a shard); --expert-parallel keeps experts whole,
    so 4 shards of one expert each split only attention (hidden 128: 32 inputs a shard)."""
    path = fixture(MOE)
    for num_shard in (1, 2):
        check_quantization(None, num_shard, path)
    with pytest.raises(QuantizationCheckError, match=r"--num-shard 4 .*values that work: 1, 2$"):
        check_quantization(None, 4, path)
    check_quantization("gptq", 4, path, expert_parallel=True)


@pytest.mark.parametrize("name", [*INT4_EXPERTS, FLOAT_EXPERTS])
@pytest.mark.parametrize(
    "flags", [[], ["--num-shard", "2"], ["--num-shard", "2", "--expert-parallel"]]
)
def test_the_launcher_spawns_the_shards_of_int4_and_float_experts(monkeypatch, name, flags):
    """Every pre-spawn check passes (shard counts, experts, quantization) and the shards get
    their command lines."""

    class Spawned:  # records the plan instead of spawning it
        plan = None

        def __init__(self, plan, _settings) -> None:
            Spawned.plan = plan

        def request_stop(self) -> None:
            pass

        def run(self) -> int:
            return 0

    monkeypatch.setattr(launcher_main, "Supervisor", Spawned)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    method = quant_config(name)["quant_method"]
    argv = ["--model-id", str(fixture(name)), "--quantize", method, *flags]
    assert launcher_main.main(argv) == 0
    num_shard = int(flags[1]) if flags else 1
    assert len(Spawned.plan.shards) == num_shard
    assert all("--quantize" in shard.argv for shard in Spawned.plan.shards)


def test_the_launcher_splits_float_experts_on_the_attention_groups_only():
    """Hidden size 64, group 32: o_proj's inputs split on group boundaries across 1 or 2
    shards, not 4 (16 per shard); the experts, floating point, constrain nothing here."""
    path = fixture(FLOAT_EXPERTS)
    for num_shard in (1, 2):
        check_quantization(None, num_shard, path)
    check_quantization("gptq", 1, path)
    with pytest.raises(QuantizationCheckError, match=r"--num-shard 4 .*values that work: 1, 2$"):
        check_quantization(None, 4, path)


def _moe_config(tmp_path: Path, drop: tuple[str, ...] = (), **fields) -> Path:
    """The fixture's config.json (GPTQ, group 32, 4 heads of 32, 2 KV heads) with `fields`,
    without `drop`."""
    config = json.loads((fixture(MOE) / "config.json").read_text())
    config.update(fields)
    for field in drop:
        del config[field]
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_an_intermediate_size_no_layer_uses_does_not_refuse_a_shard_count(tmp_path):
    """Qwen3-MoE with every layer sparse: intermediate_size (for dense layers) is never loaded,
    so a value that 2 shards could not split on group boundaries (96 / 2 = 48) is no reason to
    refuse --num-shard 2; once a layer is dense (mlp_only_layers), it is."""
    check_quantization(None, 2, _moe_config(tmp_path, intermediate_size=96))
    with pytest.raises(QuantizationCheckError, match=r"--num-shard 2 .*values that work: 1$"):
        check_quantization(
            None, 2, _moe_config(tmp_path, intermediate_size=96, mlp_only_layers=[1])
        )


def test_mixtral_experts_intermediate_size_is_the_int4_experts(tmp_path):
    """Mixtral's intermediate_size is its experts': int4 experts of 96 cannot split across 2
    shards on groups of 32 (48 a shard), unless --expert-parallel keeps them whole."""
    mixtral = dict(architectures=["MixtralForCausalLM"], model_type="mixtral")
    path = _moe_config(tmp_path, ("moe_intermediate_size",), **mixtral, intermediate_size=96)
    with pytest.raises(QuantizationCheckError, match=r"--num-shard 2 .*values that work: 1$"):
        check_quantization(None, 2, path)
    check_quantization(None, 2, path, expert_parallel=True)


def test_a_shared_expert_that_cannot_split_is_refused(tmp_path):
    """Qwen2-MoE's shared expert is a quantized gated MLP split like a dense one: 96 / 2 = 48
    inputs of its down_proj per shard cut a group of 32."""
    qwen2_moe = dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe")
    path = _moe_config(tmp_path, **qwen2_moe, shared_expert_intermediate_size=96)
    with pytest.raises(QuantizationCheckError, match=r"--num-shard 2 .*values that work: 1$"):
        check_quantization(None, 2, path)
    check_quantization(
        None, 2, _moe_config(tmp_path, **qwen2_moe, shared_expert_intermediate_size=128)
    )
