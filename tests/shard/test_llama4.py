"""Llama 4's pieces beyond the whole-model comparisons (test_models_vs_transformers.py,
test_tensor_parallel.py, tests/kernels/test_models_triton.py): the router against transformers'
own module, the experts read from a per-expert checkpoint, configs refused by field."""

from __future__ import annotations

import shutil

import pytest
import torch
from config_edits import assert_refused
from paged_helpers import run_paged
from safetensors.torch import load_file, save_file
from transformers import Llama4TextConfig
from transformers.models.llama4.modeling_llama4 import Llama4Router

from shard.distributed import Distributed
from shard.layers.moe import route_top_sigmoid
from shard.models import load_model

CPU = torch.device("cpu")
PROMPTS = [torch.arange(3, 40) * 7 % 500, torch.arange(11, 20)]


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_router_equals_transformers(top_k, dtype):
    config = Llama4TextConfig(hidden_size=32, num_local_experts=6, num_experts_per_tok=top_k)
    router = Llama4Router(config).to(dtype)
    gen = torch.Generator().manual_seed(top_k)
    with torch.no_grad():
        router.weight.normal_(0.0, 0.3, generator=gen)
    x = torch.randn(50, 32, generator=gen).to(dtype)
    with torch.no_grad():
        scores, logits = router(x)  # [T, E]: the chosen experts' sigmoids, zeros elsewhere
    weights, ids = route_top_sigmoid(logits, top_k, round_to=dtype)
    dense = torch.zeros(scores.shape, dtype=torch.float32).scatter_(1, ids.long(), weights)
    assert torch.equal(dense > 0, scores > 0)  # the same experts
    # the same weights, within the last bit of a sigmoid taken over other shapes (float32)
    torch.testing.assert_close(dense, scores.float(), atol=1e-7, rtol=0)


def _per_expert(source, dst):
    """The checkpoint with each expert's gate, up and down as modules of their own (the layout
    FP8 exports of Llama 4 hold), transposed from transformers' input-first stacks."""
    shutil.copytree(source, dst)
    tensors = load_file(dst / "model.safetensors")
    for name in [n for n in tensors if n.endswith("experts.gate_up_proj")]:
        prefix = name.removesuffix("gate_up_proj")
        gate_up, down = tensors.pop(name), tensors.pop(f"{prefix}down_proj")
        half = gate_up.shape[2] // 2
        for e in range(gate_up.shape[0]):
            tensors[f"{prefix}{e}.gate_proj.weight"] = gate_up[e, :, :half].T.contiguous()
            tensors[f"{prefix}{e}.up_proj.weight"] = gate_up[e, :, half:].T.contiguous()
            tensors[f"{prefix}{e}.down_proj.weight"] = down[e].T.contiguous()
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("name", ["llama4_chunked_nope_top1", "llama4_vision_language"])
def test_per_expert_checkpoint_equals_the_stacked_one(tiny_model, tmp_path, name):
    stacked = tiny_model(name)
    split = _per_expert(stacked, tmp_path / "split")
    models = [
        load_model(p, dtype=torch.float32, device=CPU, dist=Distributed()) for p in (stacked, split)
    ]
    (want, _), (got, _) = (run_paged(m, PROMPTS, steps=3) for m in models)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"attention_chunk_size": None}, "attention_chunk_size"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        ({"no_rope_layers": [1]}, "no_rope_layers"),
    ],
)
def test_configs_refused_by_field(tiny_model, tmp_path, change, field):
    assert_refused(tiny_model("llama4_chunked_nope_top1"), tmp_path / "edited", change, field)
