"""The MoE layer's parts on their own: the router's top-k weighting as each architecture's
transformers block computes it, the experts' grouped form against a per-token loop, each rank's
read of the experts (tensor parallel: a slice of every expert; expert parallel: whole experts),
and the two checkpoint layouts giving the same model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from launcher.tiny_models import build_model
from shard.distributed import Distributed
from shard.layers.moe import FusedMoE, route
from shard.models import load_model
from shard.platforms.grouped_moe import grouped_experts
from shard.weights import Weights, WeightsError
from tests.shard.paged_helpers import run_paged
from tests.shard.tiny_model_cases import MOE_MODELS

CPU = torch.device("cpu")


def test_route_renormalises_and_rounds_as_asked():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 3.5, 1.0]])
    probs = torch.softmax(logits, -1)
    weights, ids = route(logits, 2, renormalize=False, round_to=None)
    assert ids.dtype == torch.int32 and ids.tolist() == [[0, 1], [2, 1]]
    torch.testing.assert_close(weights, probs.gather(1, ids.long()))
    renormed, _ = route(logits, 2, renormalize=True, round_to=None)
    torch.testing.assert_close(renormed.sum(-1), torch.ones(2))
    rounded, _ = route(logits, 2, renormalize=False, round_to=torch.bfloat16)
    assert rounded.dtype == torch.float32
    assert torch.equal(rounded, weights.to(torch.bfloat16).float())


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
def test_grouped_experts_equal_a_loop_over_tokens(act):
    gen = torch.Generator().manual_seed(0)
    tokens, hidden, inter, experts, k = 9, 12, 7, 5, 3
    x = torch.randn(tokens, hidden, generator=gen, dtype=torch.float64)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen, dtype=torch.float64)
    w2 = torch.randn(experts, hidden, inter, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, experts - 1, (tokens, k), generator=gen, dtype=torch.int32)  # 4 empty
    ids[2] = torch.tensor([-1, 0, -1])  # expert parallel: choices held by another rank
    weights = torch.rand(tokens, k, generator=gen)
    fn = {"silu": F.silu, "gelu_pytorch_tanh": lambda g: F.gelu(g, approximate="tanh")}[act]
    want = torch.zeros_like(x)
    for t in range(tokens):
        for j in range(k):
            e = int(ids[t, j])
            if e >= 0:
                gate, up = (w13[e] @ x[t]).chunk(2)
                want[t] += float(weights[t, j]) * (w2[e] @ (fn(gate) * up))
    got = grouped_experts(x, w13, w2, weights, ids, act)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _names() -> tuple[list[str], str]:
    prefix = "model.layers.0.mlp.experts"
    return [f"{prefix}.{{e}}.gate_proj", f"{prefix}.{{e}}.up_proj"], f"{prefix}.{{e}}.down_proj"


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_each_rank_reads_its_slice_or_its_experts(tiny_model, expert_parallel):
    """Ranks of a world of 2, built without a process group (loading needs none)."""
    path = tiny_model("qwen3_moe_norm_topk")  # 8 experts, intermediate 32, hidden 64
    whole = Weights(path, dtype=torch.float32, device=CPU, dist=Distributed())
    gate_up, down = _names()
    full = FusedMoE.load(whole, gate_up, down, num_experts=8, intermediate_size=32, act="silu",
                         expert_parallel=False)  # fmt: skip
    for rank in range(2):
        weights = Weights(path, dtype=torch.float32, device=CPU,
                          dist=Distributed(rank=rank, world_size=2),
                          expert_parallel=expert_parallel)  # fmt: skip
        layer = FusedMoE.load(weights, gate_up, down, num_experts=8, intermediate_size=32,
                              act="silu", expert_parallel=expert_parallel)  # fmt: skip
        if expert_parallel:
            experts = slice(4 * rank, 4 * rank + 4)
            assert layer.first_expert == 4 * rank
            assert torch.equal(layer.w13, full.w13[experts])
            assert torch.equal(layer.w2, full.w2[experts])
        else:
            rows = slice(16 * rank, 16 * rank + 16)
            gate, up = full.w13[:, :32][:, rows], full.w13[:, 32:][:, rows]
            assert torch.equal(layer.w13, torch.cat([gate, up], dim=1))
            assert torch.equal(layer.w2, full.w2[:, :, rows])


def test_expert_parallel_refuses_experts_the_ranks_cannot_share(tiny_model):
    path = tiny_model("mixtral_top2")  # 6 experts
    weights = Weights(path, dtype=torch.float32, device=CPU,
                      dist=Distributed(rank=0, world_size=4), expert_parallel=True)  # fmt: skip
    prefix = "model.layers.0.block_sparse_moe.experts.{e}"
    with pytest.raises(WeightsError, match="6 experts cannot be split across 4 shards"):
        FusedMoE.load(weights, [f"{prefix}.w1", f"{prefix}.w3"], f"{prefix}.w2", num_experts=6,
                      intermediate_size=48, act="silu", expert_parallel=True)  # fmt: skip


# K-EXAONE's module layout moves the router's correction bias too (mlp.gate. vs the Hub's mlp.)
@pytest.mark.parametrize(
    "name",
    ["mixtral_top2", "qwen2_moe_shared_dense", "exaone_moe_grouped_nope",
     "nemotron3_ungated_experts", "phimoe_sparsemixer_longrope"],
)  # fmt: skip
def test_stacked_and_per_expert_checkpoints_are_the_same_model(tiny_model, tmp_path, name):
    """transformers 5's own layout (save_original_format off) for each architecture."""
    architecture, overrides = MOE_MODELS[name]
    stacked = build_model(tmp_path, architecture, **overrides, stacked_experts=True)
    per_expert = load_model(tiny_model(name), dtype=torch.float32, device=CPU, dist=Distributed())
    ours = load_model(stacked, dtype=torch.float32, device=CPU, dist=Distributed())
    moe = [(n, p) for n, p in per_expert.named_parameters() if n.endswith(("w13", "w2", "router"))]
    assert len(moe) >= 3
    stacked_params = dict(ours.named_parameters())
    for n, p in moe:  # the router and the stacked experts (the plain linears may be repacked)
        assert torch.equal(p, stacked_params[n]), n
    prompts = [torch.arange(3, 20)]
    assert run_paged(ours, prompts, 2)[1] == run_paged(per_expert, prompts, 2)[1]


def test_stacked_experts_stored_input_first_are_read_by_their_shapes(tiny_model, tmp_path):
    """Qwen3-VL-MoE's Hub files hold the stacked experts input dimension first (gate_up
    [E, H, 2I], down [E, I, H]); transformers 5's own layout does not. Both are read, by
    their shapes, as the same model (here H = 2I: the down projection's shape decides)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from shard.layers.moe import _transposed

    source = tiny_model("qwen3_vl_moe_text_only")
    hub = tmp_path / "hub"
    shutil.copytree(source, hub)
    (file,) = hub.glob("*.safetensors")
    tensors = load_file(file)
    stacked = [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert stacked
    for key in stacked:
        tensors[key] = tensors[key].transpose(1, 2).contiguous()
    save_file(tensors, file, metadata={"format": "pt"})
    prompts = [torch.arange(3, 20), torch.arange(40, 61)]
    want = run_paged(load_model(source, dtype=torch.float32, device=CPU, dist=Distributed()),
                     prompts, 2)  # fmt: skip
    got = run_paged(load_model(hub, dtype=torch.float32, device=CPU, dist=Distributed()),
                    prompts, 2)  # fmt: skip
    assert got[1] == want[1]
    for g, w in zip(got[0], want[0], strict=True):
        assert torch.equal(g, w)
    # I = H: gate_up's 2I tells
    assert _transposed((8, 64, 128), (8, 64, 64), 64) is True
    assert _transposed((8, 128, 64), (8, 64, 64), 64) is False


def test_sparsemixer_is_transformers_router_at_inference():
    """Phi-3.5-MoE's top-2: each expert weighted by its softmax among the logits near it."""
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    from shard.layers.moe import route_sparsemixer

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(64, 16, generator=gen) * 2).to(dtype)
        logits[0, :3] = logits[0, 3]  # ties
        want_weights, want_ids = sparsemixer(logits, jitter_eps=0.05, training=False)
        weights, ids = route_sparsemixer(logits, 0.05)
        assert torch.equal(ids.long(), want_ids)
        assert torch.equal(weights, want_weights.float())
        masked = ((logits.max(-1, keepdim=True)[0] - logits) / logits.abs().clamp(
            min=logits.max(-1, keepdim=True)[0])) > 0.1  # fmt: skip
        assert masked.any() and not masked.all(dim=-1).any()  # the jitter masks some, never all
