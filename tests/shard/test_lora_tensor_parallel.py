"""LoRA under tensor parallelism, every rank of a world of 2 simulated in one process: column
layers (fused q/k/v, gate/up) give each rank its output slice of base + LoRA; row layers' two
partial products (base + this rank's A columns) sum to the whole, i.e. the one all-reduce the
base layer does carries the LoRA term too. Also over Phi-3's checkpoint, whose q/k/v and gate/up
are one tensor each and whose adapters have one A for each fused module."""

from __future__ import annotations

import json

import pytest
import torch
from lora_fixtures import ALL, PHI3_ALL, make_adapter
from safetensors.torch import load_file
from torch import nn

from shard.distributed import Distributed
from shard.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from shard.lora.manager import LoraManager, LoraSettings
from shard.models.config import ModelConfig
from shard.weights import Weights

CPU = torch.device("cpu")
LAYER = "model.layers.1"
# our layer -> the Phi-3 checkpoint module (and PEFT target) it loads
FUSED_MODULES = {
    "qkv": "self_attn.qkv_proj",
    "gate_up": "mlp.gate_up_proj",
    "o": "self_attn.o_proj",
    "down": "mlp.down_proj",
}


def _layers(
    path, rank: int, world: int, config: ModelConfig, *, fused: bool = False
) -> nn.ModuleDict:
    """Layer 1's four linears on `rank` of `world`; `fused`: from Phi-3's fused qkv_proj and
    gate_up_proj tensors, each one prefix cut into q, k, v (gate, up) pieces."""
    w = Weights(
        path, dtype=torch.float32, device=CPU, dist=Distributed(rank=rank, world_size=world)
    )
    if fused:
        qkv = [f"{LAYER}.self_attn.qkv_proj"]
        gate_up = [f"{LAYER}.mlp.gate_up_proj"]
    else:
        qkv = [f"{LAYER}.self_attn.{p}_proj" for p in "qkv"]
        gate_up = [f"{LAYER}.mlp.gate_proj", f"{LAYER}.mlp.up_proj"]
    layers = nn.ModuleDict(
        {
            "qkv": QKVParallelLinear.load_qkv(
                w,
                qkv,
                num_heads=config.num_heads,
                num_kv_heads=config.num_kv_heads,
                head_dim=config.head_dim,
                bias=config.qkv_bias,
            ),
            "gate_up": MergedColumnParallelLinear.load_merged(w, gate_up, bias=False, num_blocks=2),
            "o": RowParallelLinear.load(w, f"{LAYER}.self_attn.o_proj", bias=False),
            "down": RowParallelLinear.load(w, f"{LAYER}.mlp.down_proj", bias=False),
        }
    )
    layers.dtype, layers.device = torch.float32, CPU
    return layers


def _run(layers: nn.ModuleDict, adapter, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    lora = LoraManager(layers, LoraSettings(adapters={"ad": adapter}, max_loras=2, max_rank=8))
    slots = lora.assign(["ad", "", "ad"], []).slots  # rows 0 and 2: the adapter; row 1: base
    lora.step.set_tokens(slots)
    out = {}
    for name, layer in layers.items():
        if isinstance(layer, RowParallelLinear):  # before the all_reduce, which sums ranks
            piece = layer.input_piece
            inputs = x[name][:, piece.start : piece.stop]
            out[name] = layer.weight(inputs, None)
            layer.lora(inputs, out[name])
        else:
            out[name] = layer(x[name])
    return out


@pytest.mark.parametrize("model_name", ["llama_gqa_llama3", "mistral_mqa", "qwen2_bias"])
def test_two_ranks_add_up_to_one(tiny_model, tmp_path, model_name):
    base = tiny_model(model_name)
    adapter = make_adapter(
        base, tmp_path / "ad", seed=5, r=8, target_modules=ALL, layers_to_transform=[1]
    )
    _check_two_ranks(base, adapter, fused=False, changed={"qkv", "gate_up", "o", "down"})


# Phi-3's PEFT targets -> our layers they change
PHI3_TARGETS = {
    "all": (PHI3_ALL, {"qkv", "gate_up", "o", "down"}),
    "qkv": (["qkv_proj"], {"qkv"}),
    "gate_up": (["gate_up_proj"], {"gate_up"}),
    "o_down": (["o_proj", "down_proj"], {"o", "down"}),
}


@pytest.mark.parametrize(
    ("model_name", "targets"),
    [("phi3_gqa", t) for t in PHI3_TARGETS] + [("phi3_partial_longrope", "all")],
)  # GQA: two KV heads, one a rank; MHA
def test_fused_phi3_modules_two_ranks_add_up_to_one(tiny_model, tmp_path, model_name, targets):
    """An adapter on Phi-3's fused qkv_proj / gate_up_proj (one A, B split like the fused
    weight's rows): each rank takes its q, k, v (gate, up) rows of B and the whole A."""
    base = tiny_model(model_name)
    modules, changed = PHI3_TARGETS[targets]
    adapter = make_adapter(
        base, tmp_path / "ad", seed=6, r=8, target_modules=modules, layers_to_transform=[1]
    )
    _check_two_ranks(base, adapter, fused=True, changed=changed)


def _check_two_ranks(base, adapter, *, fused: bool, changed: set[str]) -> None:
    """One rank equals base + scaling x A^T B^T (the adapter's own tensors) in the `changed`
    layers and the base elsewhere; two ranks' column slices and row partial sums give it."""
    config = ModelConfig.load(base)
    gen = torch.Generator().manual_seed(0)
    whole = _layers(base, 0, 1, config, fused=fused)
    x = {
        "qkv": torch.randn(3, config.hidden_size, generator=gen),
        "gate_up": torch.randn(3, config.hidden_size, generator=gen),
        "o": torch.randn(3, config.num_heads * config.head_dim, generator=gen),
        "down": torch.randn(3, config.intermediate_size, generator=gen),
    }
    want = _run(whole, adapter, x)
    base_only = {n: layer.weight(x[n], None) for n, layer in whole.items()}
    for name in want:  # the adapter changes rows 0 and 2 only, of the layers it targets only
        if name in changed:
            assert not torch.allclose(want[name][0], base_only[name][0], atol=1e-3), name
        else:
            torch.testing.assert_close(want[name], base_only[name])
        torch.testing.assert_close(want[name][1], base_only[name][1])
    if fused:  # one A per fused module: the term is the whole module's x A^T B^T
        config_json = json.loads((adapter / "adapter_config.json").read_text())
        scaling = config_json["lora_alpha"] / config_json["r"]
        tensors = load_file(adapter / "adapter_model.safetensors")
        for name, module in FUSED_MODULES.items():
            key = f"base_model.model.{LAYER}.{module}.lora_{{}}.weight"
            if name in changed:
                a, b = tensors[key.format("A")], tensors[key.format("B")]
                term = scaling * (x[name] @ a.T) @ b.T
                expected = base_only[name] + term * torch.tensor([1.0, 0.0, 1.0])[:, None]
                torch.testing.assert_close(want[name], expected, atol=1e-5, rtol=0)
    ranks = [_run(_layers(base, r, 2, config, fused=fused), adapter, x) for r in range(2)]
    for name in ("o", "down"):
        torch.testing.assert_close(ranks[0][name] + ranks[1][name], want[name], atol=1e-5, rtol=0)
    d, kv_heads = config.head_dim, config.num_kv_heads
    q, k, v = want["qkv"].split([config.num_heads * d, kv_heads * d, kv_heads * d], dim=1)
    gate, up = want["gate_up"].chunk(2, dim=-1)
    for r, got in enumerate(ranks):
        # KV heads split across the ranks, or, with one KV head, replicated on both.
        k_r, v_r = (k.chunk(2, 1)[r], v.chunk(2, 1)[r]) if kv_heads >= 2 else (k, v)
        expected_qkv = torch.cat([q.chunk(2, dim=1)[r], k_r, v_r], dim=1)
        torch.testing.assert_close(got["qkv"], expected_qkv, atol=1e-5, rtol=0)
        expected_gate_up = torch.cat([gate.chunk(2, dim=1)[r], up.chunk(2, dim=1)[r]], dim=1)
        torch.testing.assert_close(got["gate_up"], expected_gate_up, atol=1e-5, rtol=0)
