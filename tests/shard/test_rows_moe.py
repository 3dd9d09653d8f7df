"""The native MoE call (shard/platforms/cpu/native/rows_moe.cpp): a decode step's SwiGLU experts
and each token's weighted sum in one call, against the torch form it replaces
(shard/platforms/grouped_moe.py with the rows kernel's linear), bit for bit, and that torch form
against transformers' own expert loop in bf16, bit for bit: each token's terms are added in
ascending expert order with a rounding per add, as transformers' index_add_ per expert does."""

from __future__ import annotations

import pytest
import torch

from shard.platforms import grouped_moe
from shard.platforms.cpu import CpuPlatform, matmul
from shard.platforms.cpu.native import build as native

KERNEL = native.rows_moe_kernel()
needs_kernel = pytest.mark.skipif(
    KERNEL is None,
    # The same on a GPU machine: the kernel is the CPU's, for x86-64 CPUs with those flags.
    reason="the rows kernel needs an x86-64 CPU with AVX2, FMA and F16C and a C++ toolchain",
)


def _step(tokens, hidden, inter, experts, k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) * 0.2).to(dtype)
    # distinct experts per token, skewed so some experts get many rows and some none
    scores = torch.rand(tokens, experts, generator=gen) + torch.linspace(1, 0, experts)
    ids = scores.topk(k, dim=1).indices.to(torch.int32)
    weights = torch.rand(tokens, k, generator=gen).to(dtype).float()
    return x, w13, w2, weights, ids


def _torch_form(x, w13, w2, weights, ids):
    return grouped_moe.grouped_experts(
        x, w13, w2, weights, ids, "silu", swiglu=CpuPlatform().swiglu, linear=matmul.linear
    )


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("tokens", "hidden", "inter", "experts", "k"),
    [
        (1, 40, 24, 4, 1),  # one row, one choice
        (16, 64, 48, 16, 2),  # a decode step of the bench's shape, smaller
        (13, 43, 37, 7, 3),  # tails past the 8-wide body in both GEMMs and both column splits
        (32, 24, 16, 8, 8),  # top-8: each token adds eight terms; an expert with 32 rows
        (5, 32, 9, 12, 4),  # most experts empty
    ],
)
def test_one_call_equals_the_torch_form_bit_for_bit(dtype, tokens, hidden, inter, experts, k,
                                                    monkeypatch):  # fmt: skip
    monkeypatch.setattr(matmul, "_cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    x, w13, w2, weights, ids = _step(tokens, hidden, inter, experts, k, dtype, seed=tokens * k)
    got = matmul.swiglu_experts(x, w13, w2, weights, ids)
    assert got is not None and got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got, _torch_form(x, w13, w2, weights, ids))


@needs_kernel
def test_other_ranks_choices_add_nothing(monkeypatch):
    """Expert parallel: -1 marks a choice held by another rank; a token with none here gets 0."""
    monkeypatch.setattr(matmul, "_cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    x, w13, w2, weights, ids = _step(6, 32, 16, 4, 3, torch.bfloat16, seed=3)
    ids[1] = -1
    ids[4, 0] = -1
    got = matmul.swiglu_experts(x, w13, w2, weights, ids)
    assert got is not None and torch.equal(got, _torch_form(x, w13, w2, weights, ids))
    assert not got[1].any()
    kept = ids[4] >= 0
    alone = matmul.swiglu_experts(x[4:5], w13, w2, weights[4:5, kept], ids[4:5, kept])
    assert torch.equal(got[4:5], alone)


@needs_kernel
def test_past_the_rows_kernel_or_without_it_the_torch_form_runs(monkeypatch):
    monkeypatch.setattr(matmul, "_cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    x, w13, w2, weights, ids = _step(matmul.ROWS_KERNEL_MAX + 1, 16, 8, 4, 1, torch.bfloat16, 1)
    ids[:] = 2  # one expert with a row past the kernel's reach
    assert matmul.swiglu_experts(x, w13, w2, weights, ids) is None
    assert matmul.swiglu_experts(x[1:], w13, w2, weights[1:], ids[1:]) is not None
    assert matmul.swiglu_experts(x.float(), w13.float(), w2.float(), weights, ids) is None
    monkeypatch.setattr(native, "rows_moe_kernel", lambda: None)
    assert matmul.swiglu_experts(x[1:], w13, w2, weights[1:], ids[1:]) is None


@needs_kernel
def test_a_bad_expert_id_is_an_error_not_a_read_out_of_bounds(monkeypatch):
    x, w13, w2, weights, ids = _step(3, 16, 8, 4, 2, torch.bfloat16, seed=5)
    ids[2, 1] = 4
    with pytest.raises(RuntimeError, match="expert id 4"):
        KERNEL(x, ids, weights, w13, w2, matmul.ROWS_KERNEL_MAX)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_the_torch_form_sums_as_transformers_expert_loop_does(k):
    """transformers' Qwen3-MoE experts (its own module, eager loop) on the same bf16 weights and
    routing: the torch form with torch's linear and activation gives the same bits."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    tokens, hidden, inter, experts = 24, 64, 32, 8
    config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter,
                            num_experts=experts, num_experts_per_tok=k)  # fmt: skip
    x, w13, w2, weights, ids = _step(tokens, hidden, inter, experts, k, torch.bfloat16, seed=k)
    reference = Qwen3MoeExperts(config).to(torch.bfloat16)
    with torch.no_grad():
        reference.gate_up_proj.copy_(w13)
        reference.down_proj.copy_(w2)
        want = reference(x, ids.long(), weights.to(torch.bfloat16))
    got = grouped_moe.grouped_experts(x, w13, w2, weights, ids, "silu")
    assert torch.equal(got, want)
    # One index_add_ over all pairs (fp32 sums, rounded once) differs from three choices on.
    if k > 2:
        order = torch.argsort(ids.reshape(-1), stable=True)
        assert not torch.equal(got, _summed_once(x, w13, w2, weights, ids, order))


def _summed_once(x, w13, w2, weights, ids, order):
    k = ids.shape[1]
    counts = torch.bincount(ids.reshape(-1)[order], minlength=w13.shape[0]).tolist()
    rows = order // k
    math = grouped_moe._ExpertMath("silu", None, torch.nn.functional.linear)
    results = grouped_moe._expert_loop(x.index_select(0, rows), counts, w13, w2, math)
    terms = (results.float() * weights.reshape(-1)[order][:, None]).to(x.dtype)
    return torch.zeros_like(x).index_add_(0, rows, terms)
