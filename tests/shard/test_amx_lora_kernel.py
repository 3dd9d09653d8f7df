"""The tile kernel's linear with LoRA terms (shard/platforms/cpu/native/amx_lora.cpp,
shard/platforms/cpu/lora_amx.py)
against a float64 reference: one to three sub-modules, slots of different ranks (some below,
some above 16, some the padded maximum), tokens without an adapter, one to three 16-row tiles
and their tails, the SwiGLU epilogue, biases, strided rows; the tiles' refill of one slot; and
its refusals."""

from __future__ import annotations

import pytest
import torch

from shard.layers.activation import swiglu
from shard.platforms.cpu import lora_amx, matmul_amx
from shard.platforms.cpu.native.build import amx_lora_linear_kernel

KERNEL = amx_lora_linear_kernel()
pytestmark = pytest.mark.skipif(
    KERNEL is None, reason="no AMX-BF16 tile unit lent to this process, or no native build"
)


def reference(x, weight, bias, lora_a, lora_b, token_slots, scaling, out_slices, gated):
    """The kernel's contract in float64: h = round_bf16(scaling * A x) per token and
    sub-module, then x W^T + bias + h B^T rounded once (and SwiGLU'd after, if gated)."""
    y = x.double() @ weight.double().T
    if bias is not None:
        y += bias.double()
    offset = 0
    for j, n in enumerate(out_slices):
        for t, s in enumerate(token_slots.tolist()):
            if s >= 0:
                h = (lora_a[s, j].double() @ x[t].double()) * scaling[s].item()
                h = h.to(torch.bfloat16).double()
                y[t, offset : offset + n] += lora_b[s, offset : offset + n].double() @ h
        offset += n
    y = y.to(torch.bfloat16)
    return swiglu(y) if gated else y


def term(slots, n_sub, max_rank, k, n, ranks, gen):
    """lora_a [S, n_sub, R, K] and lora_b [S, N, R] as LoraTerm holds them: slot s of rank
    ranks[s], zeros past it (a slot of rank 0 holds no adapter)."""
    lora_a = torch.zeros(slots, n_sub, max_rank, k, dtype=torch.bfloat16)
    lora_b = torch.zeros(slots, n, max_rank, dtype=torch.bfloat16)
    for s, r in enumerate(ranks):
        lora_a[s, :, :r] = torch.randn(n_sub, r, k, generator=gen).to(torch.bfloat16)
        lora_b[s, :, :r] = torch.randn(n, r, generator=gen).to(torch.bfloat16)
    return lora_a, lora_b


CASES = [  # K, out_slices, ranks per slot, R (--max-lora-rank), tokens, gated, bias
    (64, (32,), [16, 4, 8], 16, 5, False, False),
    (576, (576, 192, 192), [16, 16, 16, 16], 64, 16, False, True),
    (96, (48, 48), [8, 0, 4, 8, 2], 8, 40, True, True),
    (128, (64,), [32, 24], 32, 33, False, False),
    (64, (16, 32), [64, 1, 17, 40, 64, 3, 9], 64, 3, False, True),
    (192, (32, 32), [24, 16, 8], 24, 17, True, False),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_equals_the_reference(case):
    k, out_slices, ranks, max_rank, tokens, gated, with_bias = CASES[case]
    gen = torch.Generator().manual_seed(case)
    n, slots = sum(out_slices), len(ranks)
    weight = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16) if with_bias else None
    lora_a, lora_b = term(slots, len(out_slices), max_rank, k, n, ranks, gen)
    scaling = torch.rand(slots, generator=gen) * 2 + 0.25
    token_slots = torch.randint(-1, slots, (tokens,), generator=gen, dtype=torch.int32)
    token_slots[0] = -1  # a token without an adapter, and every slot with one, in each case
    token_slots[1 : 1 + min(slots, tokens - 1)] = torch.arange(min(slots, tokens - 1))
    # x's rows strided (a view into a wider tensor), as the flattened attention output is not
    x = torch.randn(tokens, k + 32, generator=gen).to(torch.bfloat16)[:, 16 : 16 + k]
    tiles = lora_amx.LoraTiles.build(lora_a, lora_b, max(min(r, max_rank) for r in ranks))
    got = KERNEL(
        x, matmul_amx.pack(weight), bias, gated, tiles.a, tiles.b, token_slots, scaling,
        tiles.rank, out_slices,
    )  # fmt: skip
    want = reference(x, weight, bias, lora_a, lora_b, token_slots, scaling, out_slices, gated)
    # fp32 sums in another order than float64's: a rounding may land one bf16 step away.
    torch.testing.assert_close(got.double(), want.double(), rtol=2**-7, atol=1e-6)
    assert (got == want).double().mean() > 0.99
    base = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    base = base.to(torch.bfloat16)
    base = swiglu(base) if gated else base
    adapter_rows = token_slots >= 0
    assert not torch.equal(got[adapter_rows], base[adapter_rows])  # the terms are there
    assert torch.equal(got[~adapter_rows], base[~adapter_rows])  # and only there


def test_a_refilled_slot_equals_a_fresh_build():
    gen = torch.Generator().manual_seed(7)
    lora_a, lora_b = term(5, 3, 32, 64, 96, [16, 8, 16, 32, 4], gen)
    tiles = lora_amx.LoraTiles.build(lora_a, lora_b, 32)
    new_a, new_b = term(5, 3, 32, 64, 96, [24] * 5, gen)
    lora_a[2], lora_b[2] = new_a[2], new_b[2]
    tiles.refill(2, lora_a, lora_b)
    fresh = lora_amx.LoraTiles.build(lora_a, lora_b, 32)
    assert torch.equal(tiles.a, fresh.a) and torch.equal(tiles.b, fresh.b)
    assert not torch.equal(tiles.a, lora_amx.LoraTiles.build(new_a, new_b, 32).a)


def test_refusals():
    gen = torch.Generator().manual_seed(3)
    lora_a, lora_b = term(2, 1, 16, 64, 32, [16, 16], gen)
    tiles = lora_amx.LoraTiles.build(lora_a, lora_b, 16)
    packed = matmul_amx.pack(torch.randn(32, 64).to(torch.bfloat16))
    x, scaling = torch.randn(3, 64).to(torch.bfloat16), torch.ones(2)
    call = lambda slots, out=(32,): KERNEL(  # noqa: E731
        x, packed, None, False, tiles.a, tiles.b, slots, scaling, 16, out
    )
    with pytest.raises(RuntimeError, match="slot 2 is not one of the 2 slots"):
        call(torch.tensor([0, 2, -1], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="must be \\[M\\] int32"):
        call(torch.tensor([0, 1, -1]))
    two = lora_amx.LoraTiles.build(*term(2, 2, 16, 64, 32, [16, 16], gen), 16)
    with pytest.raises(RuntimeError, match="whole blocks of 16"):
        KERNEL(x, packed, None, False, two.a, two.b, torch.zeros(3, dtype=torch.int32),
               scaling, 16, (24, 8))  # fmt: skip
    # A term whose sub-modules do not tile, or a weight the tile kernel does not hold, gets no
    # kernel: its linear adds the term after the base product instead.
    assert lora_amx.kernel_for(packed, (24, 8)) is None
    assert lora_amx.kernel_for(torch.randn(32, 64).to(torch.bfloat16), (32,)) is None
    assert lora_amx.kernel_for(packed, (32,)) is not None
