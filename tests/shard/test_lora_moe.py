"""PEFT adapters on the Mixture-of-Experts models (Mixtral, Qwen2-MoE, Qwen3-MoE), against
transformers + peft alone (float32), as test_lora_new_archs.py does for the dense ones.

What takes a LoRA is what our tensor-parallel linears hold: the attention projections, and on
Qwen2-MoE the shared expert and the dense layers (mlp_only_layers), plain gated MLPs. PEFT 0.21
on transformers 5 puts a gate_proj/up_proj/down_proj target on exactly those there (Qwen2-MoE's
stacked experts are 3D parameters, not nn.Linear, and PEFT's transformers-4-to-5 target
conversion, which it has for mixtral and qwen3_moe, is not registered for qwen2_moe itself).

What does not: the routed experts (FusedMoE's stacked weights) and the router. Their adapters are
refused at load, naming the module: PEFT's own on transformers 5 (target_parameters on the stacked
experts or the router; PEFT turns target_modules w1..w3 / gate_proj... / gate on Mixtral and
Qwen3-MoE into those by itself), and the common real case, adapters PEFT wrote on transformers 4
where every expert was an nn.Linear (`mlp.experts.3.gate_proj`, `block_sparse_moe.experts.3.w1`,
the router `mlp.gate` / `block_sparse_moe.gate`). PEFT cannot write those on transformers 5, so
they are built here with safetensors, and PEFT itself checks that it reads them as expert LoRAs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lora_fixtures import make_adapter, peft_reference
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from shard.distributed import Distributed
from shard.lora.adapter import AdapterError
from shard.lora.manager import LoraManager, LoraSettings
from shard.models import load_model
from tests.shard.servicer_helpers import prompts
from tests.shard.test_lora_new_archs import _greedy
from tests.shard.test_lora_vs_peft import LOGPROB_ATOL, NEW_TOKENS, lora_service, serve_mixed

CPU = torch.device("cpu")
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
ATTENTION_ADAPTERS = {
    "qv_r4": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "attention_rslora_r8": dict(
        r=8,
        lora_alpha=16,
        use_rslora=True,
        target_modules=ATTENTION,
        rank_pattern={"layers.1.self_attn.o_proj": 4},
    ),
}
# Qwen2-MoE: also the shared expert's and the dense layer's gate/up/down.
QWEN2_MOE_ADAPTERS = {
    **ATTENTION_ADAPTERS,
    "shared_dense_mlp_r8": dict(r=8, lora_alpha=32, target_modules=MLP),
    "all_r16": dict(r=16, lora_alpha=16, target_modules=ATTENTION + MLP),
}
CASES = {
    "mixtral_top2": ATTENTION_ADAPTERS,
    "qwen2_moe_shared_dense": QWEN2_MOE_ADAPTERS,
    "qwen3_moe_norm_topk": ATTENTION_ADAPTERS,
}


@pytest.fixture(scope="module", params=list(CASES))
def setup(request, tiny_model, tmp_path_factory):
    """The model's checkpoint, its adapters (name -> dir), a servicer with all of them, and
    PEFT's unmerged references (name -> model, "" the base), loaded once for the module."""
    base = tiny_model(request.param)
    root = tmp_path_factory.mktemp("adapters")
    adapters = {
        name: make_adapter(base, root / name, seed=60 + i, **config)
        for i, (name, config) in enumerate(CASES[request.param].items())
    }
    service = lora_service(base, adapters, max_loras=len(adapters))
    references = {name: peft_reference(base, path) for name, path in adapters.items()}
    references[""] = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    return base, adapters, service, references


def _check(got: dict[int, list], names: list[str], texts: list[list[int]], references) -> None:
    for i, (name, prompt) in enumerate(zip(names, texts, strict=True)):
        want_ids, want_lps = _greedy(references[name], prompt)
        assert [t for t, _ in got[i][:NEW_TOKENS]] == want_ids, f"request {i} ({name or 'base'})"
        lps = torch.tensor([lp for _, lp in got[i][:NEW_TOKENS]])
        torch.testing.assert_close(lps, torch.tensor(want_lps), atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.parametrize("chunked", [False, True])
def test_adapters_mixed_with_the_base_model_equal_peft_alone(setup, chunked):
    _, adapters, service, references = setup
    first = next(iter(adapters))
    names = ["", *adapters, first]  # the base model, every adapter, one adapter twice
    texts, got = serve_mixed(service, names, seed=3, chunk=7 if chunked else None)
    _check(got, names, texts, references)


def test_adapters_equal_peft_merged_into_the_weights(setup):
    """PEFT's merged model too (merge_and_unload: the adapter folded into q_proj ... and the
    shared expert's weights), so the reference is not PEFT's own LoRA forward alone."""
    base, adapters, service, references = setup
    merged = {"": references[""]}
    merged |= {n: peft_reference(base, p).merge_and_unload().eval() for n, p in adapters.items()}
    names = [*adapters, ""]
    texts, got = serve_mixed(service, names, seed=5)
    _check(got, names, texts, merged)


def test_every_adapter_changes_the_output(setup):
    """Guards the tests above against adapters too weak to matter."""
    _, adapters, _, references = setup
    prompt = [3 + t % 300 for t in prompts(1, seed=9)[0]]
    plain = _greedy(references[""], prompt)[1]
    for name in adapters:
        assert _greedy(references[name], prompt)[1] != pytest.approx(plain, abs=1e-3), name


def _modules(adapter: Path) -> set[str]:
    with safe_open(adapter / "adapter_model.safetensors", "pt") as file:
        return {k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in file.keys()}


@pytest.fixture(scope="module")
def moe_model(tiny_model):
    """name -> (checkpoint, loaded model), each loaded once."""
    loaded = {}

    def get(name: str):
        if name not in loaded:
            base = tiny_model(name)
            model = load_model(base, dtype=torch.float32, device=CPU, dist=Distributed())
            loaded[name] = base, model
        return loaded[name]

    return get


def _load(model, path: Path) -> LoraManager:
    return LoraManager(model, LoraSettings(adapters={"moe": path}, max_loras=1))


def _refusal(module: str, part: str) -> str:
    return (
        rf"adapter 'moe': module '{module}' {part} of a Mixture-of-Experts block: the routed "
        r"experts and the router of a Mixture-of-Experts block \(and its shared-expert gate\) "
        r"take no LoRA adapters here, only the attention projections and dense or shared-expert "
        r"MLPs do; supported: q_proj, k_proj, v_proj, o_proj"
    )


EXPERT, EXPERTS, ROUTER = "is a routed expert", "holds the routed experts", "is the router"


def test_peft_puts_qwen2_moe_mlp_targets_on_the_shared_expert_and_dense_layer_only(
    moe_model, tmp_path
):
    """The premise of QWEN2_MOE_ADAPTERS: on transformers 5, PEFT's gate_proj/up_proj/down_proj
    on Qwen2-MoE are the shared expert's (layers 0, 2) and the dense layer's (1), no expert's;
    and the served model takes each of them, with no LoRA term on an expert or the router."""
    base, model = moe_model("qwen2_moe_shared_dense")
    path = make_adapter(base, tmp_path / "mlp", seed=0, **QWEN2_MOE_ADAPTERS["shared_dense_mlp_r8"])
    want = {f"model.layers.{i}.mlp.shared_expert.{m}" for i in (0, 2) for m in MLP}
    want |= {f"model.layers.1.mlp.{m}" for m in MLP}
    assert _modules(path) == want
    manager = _load(model, path)
    assert set(manager.cache["moe"].modules) == want
    assert not any("experts." in m or m.endswith("gate") for m in manager.module_shapes)


# -- refusals ----------------------------------------------------------------------------


# (model, LoraConfig arguments, the module named, which part of the block it is)
PEFT_REFUSED = {
    # PEFT turns these target_modules into target_parameters on the stacked experts.
    "qwen3_mlp_targets": (
        "qwen3_moe_norm_topk",
        dict(target_modules=MLP),
        "model.layers.0.mlp.experts",
        EXPERTS,
    ),
    "mixtral_w1_w2_w3": (
        "mixtral_top2",
        dict(target_modules=["w1", "w2", "w3"]),
        "model.layers.0.mlp.experts",
        EXPERTS,
    ),
    "qwen3_target_parameters": (
        "qwen3_moe_norm_topk",
        dict(target_modules=["q_proj"], target_parameters=["mlp.experts.gate_up_proj"]),
        "model.layers.0.mlp.experts",
        EXPERTS,
    ),
    "qwen2_target_parameters": (
        "qwen2_moe_shared_dense",
        dict(target_modules=["q_proj"], target_parameters=["mlp.experts.down_proj"]),
        "model.layers.0.mlp.experts",
        EXPERTS,
    ),
    # gpt-oss's experts (transposed, interleaved, biased parameters)
    "gpt_oss_target_parameters": (
        "gpt_oss_sinks_clamped",
        dict(target_modules=["q_proj"], target_parameters=["mlp.experts.gate_up_proj"]),
        "model.layers.0.mlp.experts",
        EXPERTS,
    ),
    # the router, as PEFT targets it (`gate`; it refuses Qwen2-MoE's, not an nn.Linear there)
    "mixtral_router": (
        "mixtral_top2",
        dict(target_modules=["gate"]),
        "model.layers.0.mlp.gate",
        ROUTER,
    ),
    "qwen3_router": (
        "qwen3_moe_norm_topk",
        dict(target_modules=["gate"]),
        "model.layers.0.mlp.gate",
        ROUTER,
    ),
    # Qwen2-MoE's shared-expert gate is an nn.Linear [1, H] to PEFT, replicated here.
    "qwen2_shared_expert_gate": (
        "qwen2_moe_shared_dense",
        dict(target_modules=["q_proj", "shared_expert_gate"]),
        "model.layers.0.mlp.shared_expert_gate",
        "is the shared expert's gate",
    ),
}


@pytest.mark.parametrize("case", list(PEFT_REFUSED))
def test_peft_adapters_on_experts_or_router_are_refused_naming_the_module(
    moe_model, tmp_path, case
):
    name, config, module, part = PEFT_REFUSED[case]
    base, model = moe_model(name)
    path = make_adapter(base, tmp_path / "moe", seed=0, r=4, **config)
    written = json.loads((path / "adapter_config.json").read_text())
    assert any(module in m for m in _modules(path))  # PEFT's weights are for that module
    supported = r", gate_proj, up_proj, down_proj" if name.startswith("qwen2") else "$"
    message = _refusal(module, part) + supported
    if written.get("target_parameters"):  # what PEFT wrote for the stacked parameters
        message = _refusal(module, part) + r".* \(LoRA on parameters: target_parameters = "
    with pytest.raises(AdapterError, match=message):
        _load(model, path)


def _transformers4_adapter(
    out: Path, modules: dict[str, tuple[int, int]], target_modules: list[str] | str
) -> Path:
    """A LoRA adapter as PEFT wrote it on transformers 4: `modules` (checkpoint prefix ->
    (in, out) features) each with lora_A [4, in] and lora_B [out, 4]."""
    out.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for module, (fan_in, fan_out) in modules.items():
        prefix = f"base_model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(4, fan_in, generator=generator) * 0.2
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, 4, generator=generator) * 0.2
    save_file(tensors, out / "adapter_model.safetensors", metadata={"format": "pt"})
    config = dict(peft_type="LORA", task_type="CAUSAL_LM", r=4, lora_alpha=8, bias="none",
                  target_modules=target_modules)  # fmt: skip
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def _per_expert(block: str, layers: int, experts: int, names, hidden: int, inter: int) -> dict:
    """Every expert's gate/up ([H -> I]) and down ([I -> H]) of `layers` layers."""
    gate, up, down = names
    shapes = {gate: (hidden, inter), up: (hidden, inter), down: (inter, hidden)}
    return {
        f"model.layers.{i}.{block}.experts.{e}.{m}": shape
        for i in range(layers) for e in range(experts) for m, shape in shapes.items()
    }  # fmt: skip


def _attention(layers: int, q: int, kv: int, hidden: int) -> dict:
    return {
        f"model.layers.{i}.self_attn.{m}": shape
        for i in range(layers)
        for m, shape in (("q_proj", (hidden, q)), ("v_proj", (hidden, kv)))
    }


MIXTRAL_EXPERTS = _per_expert("block_sparse_moe", 2, 6, ("w1", "w3", "w2"), 64, 48)
QWEN3_EXPERTS = _per_expert("mlp", 2, 8, MLP, 64, 32)
QWEN2_EXPERTS = {k: v for k, v in _per_expert("mlp", 3, 8, MLP, 64, 32).items() if ".1." not in k}
QWEN2_SHARED_DENSE = {
    **{f"model.layers.{i}.mlp.shared_expert.{m}": s for i in (0, 2)
       for m, s in (("gate_proj", (64, 48)), ("up_proj", (64, 48)), ("down_proj", (48, 64)))},
    **{f"model.layers.1.mlp.{m}": s
       for m, s in (("gate_proj", (64, 128)), ("up_proj", (64, 128)), ("down_proj", (128, 64)))},
}  # fmt: skip
# (model, the adapter's modules, its target_modules, the module named, which part it is)
TRANSFORMERS4_REFUSED = {
    "mixtral_experts": (
        "mixtral_top2",
        {**_attention(2, 64, 32, 64), **MIXTRAL_EXPERTS},
        ["q_proj", "v_proj", "w1", "w2", "w3"],
        "model.layers.0.block_sparse_moe.experts.0.w1",
        EXPERT,
    ),
    "mixtral_router": (
        "mixtral_top2",
        {f"model.layers.{i}.block_sparse_moe.gate": (64, 6) for i in range(2)},
        ["gate"],
        "model.layers.0.block_sparse_moe.gate",
        ROUTER,
    ),
    "qwen3_experts": (
        "qwen3_moe_norm_topk",
        {**_attention(2, 128, 64, 64), **QWEN3_EXPERTS},
        ["q_proj", "v_proj", *MLP],
        "model.layers.0.mlp.experts.0.down_proj",
        EXPERT,
    ),
    "qwen3_experts_regex": (  # a regex target: no list to check, the weights name the module
        "qwen3_moe_norm_topk",
        QWEN3_EXPERTS,
        r".*\.experts\.\d+\.(gate_proj|up_proj|down_proj)",
        "model.layers.0.mlp.experts.0.down_proj",
        EXPERT,
    ),
    # gate_proj... are served on the shared expert and the dense layer: the experts' ones named
    "qwen2_experts": (
        "qwen2_moe_shared_dense",
        {**QWEN2_SHARED_DENSE, **QWEN2_EXPERTS},
        MLP,
        "model.layers.0.mlp.experts.0.down_proj",
        EXPERT,
    ),
    "qwen2_router": (
        "qwen2_moe_shared_dense",
        {f"model.layers.{i}.mlp.gate": (64, 8) for i in (0, 2)},
        ["q_proj", "gate"],
        "model.layers.0.mlp.gate",
        ROUTER,
    ),
}


@pytest.mark.parametrize("case", list(TRANSFORMERS4_REFUSED))
def test_transformers4_adapters_on_experts_or_router_are_refused_naming_the_module(
    moe_model, tmp_path, case
):
    name, modules, targets, module, part = TRANSFORMERS4_REFUSED[case]
    base, model = moe_model(name)
    path = _transformers4_adapter(tmp_path / "moe", modules, targets)
    supported = r", gate_proj, up_proj, down_proj$" if name.startswith("qwen2") else "$"
    with pytest.raises(AdapterError, match=_refusal(module, part) + supported):
        _load(model, path)


@pytest.mark.parametrize("case", ["mixtral_experts", "mixtral_router", "qwen3_experts"])
def test_peft_reads_the_transformers4_files_as_expert_and_router_loras(tiny_model, tmp_path, case):
    """The files above are what PEFT takes for a transformers 4 adapter: it converts them onto
    transformers 5's stacked experts (or the router) and they change the output."""
    from peft import PeftModel

    name, modules, targets, _, _ = TRANSFORMERS4_REFUSED[case]
    path = _transformers4_adapter(tmp_path / "moe", modules, targets)
    base = AutoModelForCausalLM.from_pretrained(tiny_model(name), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, path).eval()
    assert model.peft_config["default"].target_parameters  # onto the stacked parameters
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        adapted = model(ids).logits
        with model.disable_adapter():
            plain = model(ids).logits
    assert not torch.allclose(adapted, plain, atol=1e-3)
