"""The fused MoE kernel's int4 experts (INT4_W: shard/platforms/cuda/kernels/moe_int4.py) against
the float64 reference of test_fused_moe.py on the same experts dequantized (each int4 tile is
dequantized to the very values of that dense weight: code - zero exact, times the scale in fp32,
rounded once to x's dtype), within the dense kernel's tolerances. Not bit for bit against the
dense kernel: the int4 tile is a transposed view, and the interpreter's numpy matmul sums in
another order for another layout (a few fp32 ulps, seen).

The experts are random int4 weights in the internal layout (codes, zero points and scales per
group, act-order g_idx per expert): the kernel's operand, not a checkpoint format (checkpoints
made by the formats' tools are served in tests/shard/test_quantized_moe.py)."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_cases import DEVICE
from test_fused_moe import TOLERANCES, make_case, reference

from shard.layers.quant.int4 import pack_rows
from shard.platforms.cuda.kernels.fused_moe import Tiles, fused_moe
from shard.platforms.int4_experts import Int4Experts


def int4_experts(
    experts: int,
    outputs: int,
    inputs: int,
    group_size: int,
    act_order: bool,
    gen: torch.Generator,
    dtype: torch.dtype = torch.float16,
) -> Int4Experts:
    """Random codes and zero points (asymmetric), scales about 1 / (4 sqrt(K)) so each
    dequantized weight is O(1 / sqrt(K)) like make_case's; act_order: each expert's rows in its
    own random order of groups (GPTQ's desc_act g_idx).

    Each scale is 8..15 times a power of two, so (code - zero) * scale (4 bits times 4) is exact
    in bf16 as in fp16: the weights are the same whichever way a conversion rounds (triton's
    interpreter truncates fp32 to bf16, torch and the GPU round to nearest)."""
    groups = -(-inputs // group_size)
    codes = torch.randint(0, 16, (experts, inputs, outputs), generator=gen)
    qweight = torch.stack([pack_rows(c) for c in codes])
    zeros = torch.randint(0, 16, (experts, groups, outputs), generator=gen).to(torch.uint8)
    steps = torch.randint(8, 16, (experts, groups, outputs), generator=gen).float()
    scales = steps * 2.0 ** -(4 + round(math.log2(4 * inputs**0.5)))
    g_idx = None
    if act_order:
        rows = torch.arange(inputs) // group_size
        g_idx = torch.stack([rows[torch.randperm(inputs, generator=gen)] for _ in range(experts)])
    return Int4Experts(qweight, zeros, scales.to(dtype), group_size, g_idx)


def on_device(w: Int4Experts) -> Int4Experts:
    return w.to(DEVICE)


# (tokens, hidden, inter, experts, top_k, routing, dtype, group of w13, of w2, act-order, tiles):
# groups that hold several K tiles (one scale row per tile) and K tiles that hold several groups
# (a group per row), a K tail (H = 72, 40: not a multiple of the K tile), act-order, empty and
# other ranks' experts, top-k 1 to 8, decode-sized and many-row steps.
CASES = [
    (1, 64, 32, 4, 1, "uniform", torch.float32, 64, 32, False, None),
    (3, 72, 40, 8, 8, "uniform", torch.bfloat16, 24, 8, False, None),
    (40, 128, 64, 6, 2, "uneven", torch.float16, 32, 32, False, Tiles(16, 32, 64)),
    (40, 72, 40, 6, 2, "uneven", torch.float32, 8, 40, True, Tiles(16, 16, 16)),
    (37, 64, 32, 4, 1, "one", torch.bfloat16, 64, 16, False, Tiles(64, 32, 16)),
    (40, 128, 48, 10, 8, "parallel", torch.bfloat16, 128, 16, True, None),
]


@pytest.mark.parametrize(("tokens", "hidden", "inter", "experts", "top_k", "kind", "dtype",
                          "group13", "group2", "act_order", "tiles"), CASES)  # fmt: skip
def test_int4_experts_match_their_dequantized_weights(
    tokens, hidden, inter, experts, top_k, kind, dtype, group13, group2, act_order, tiles
) -> None:
    x, _, _, weights, ids = make_case(tokens, hidden, inter, experts, top_k, kind)
    gen = torch.Generator().manual_seed(7)
    q13 = int4_experts(experts, 2 * inter, hidden, group13, act_order, gen)
    q2 = int4_experts(experts, hidden, inter, group2, act_order, gen)
    x = x.to(dtype)
    w13, w2 = q13.dequantize(dtype), q2.dequantize(dtype)
    int4 = fused_moe(
        x.to(DEVICE), on_device(q13), on_device(q2), weights.to(DEVICE), ids.to(DEVICE), "silu",
        tiles=tiles,
    )  # fmt: skip
    assert int4.dtype == dtype and int4.shape == x.shape
    want = reference(x, w13, w2, weights, ids, "silu")
    torch.testing.assert_close(int4.cpu().double(), want, **TOLERANCES[dtype], check_dtype=False)
    if kind == "parallel":  # a token whose experts are all another rank's gets exactly 0
        assert not int4[0].any()


def test_the_stack_dequantizes_each_expert_as_the_int4_layout_says() -> None:
    """Int4Experts.dequantize (the reference above) against QuantizedWeight's, per expert."""
    from shard.layers.quant.int4 import QuantizedWeight

    gen = torch.Generator().manual_seed(3)
    for act_order in (False, True):
        stack = int4_experts(3, 24, 64, 16, act_order, gen)
        dense = stack.dequantize(torch.float32)
        for e in range(3):
            one = QuantizedWeight(
                stack.qweight[e], stack.zeros[e], stack.scales[e], 16,
                None if stack.g_idx is None else stack.g_idx[e],
            )  # fmt: skip
            assert torch.equal(dense[e], one.dequantize(torch.float32).T)


def test_mismatched_int4_operands_are_refused() -> None:
    gen = torch.Generator().manual_seed(1)
    x, w13, w2, weights, ids = (t.to(DEVICE) for t in make_case(2, 64, 32, 2, 1, "uniform"))
    q13 = on_device(int4_experts(2, 64, 64, 32, False, gen))
    q2 = on_device(int4_experts(2, 64, 32, 32, False, gen))
    with pytest.raises(ValueError, match="both int4 experts, or neither"):
        fused_moe(x, q13, w2, weights, ids, "silu")
    mismatch = r"int4 w2 holds 2 experts of \[64, 64\] .*want 2 of \[64, 32\]"
    with pytest.raises(ValueError, match=mismatch):
        wrong = on_device(int4_experts(2, 64, 64, 32, False, gen))
        fused_moe(x, q13, wrong, weights, ids, "silu")
    with pytest.raises(ValueError, match="int4 experts take no biases"):
        bias = torch.zeros(2, 64, device=DEVICE)
        fused_moe(x, q13, q2, weights, ids, "silu", w13_bias=bias)
    assert w13.shape == (2, 64, 64)  # the dense case's shapes are the int4 ones'
