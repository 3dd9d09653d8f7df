"""SwiGLU in the AMX tile kernel's epilogue (amx_linear_silu_mul, matmul_amx.linear_silu_mul):
the same bf16 values as the fused gate_up product followed by silu_and_mul, and the MLP's
gate_up layer taking it only where nothing must be added to the product first."""

import pytest
import torch
import torch.nn.functional as F

from shard.layers.activation import act_and_mul, silu_and_mul
from shard.layers.linear import MergedColumnParallelLinear
from shard.layers.quant.unquantized import DenseWeight
from shard.platforms.cpu import matmul_amx
from shard.platforms.cpu.native.build import amx_linear_silu_mul_kernel

needs_amx = pytest.mark.skipif(
    amx_linear_silu_mul_kernel() is None,
    reason="the tile kernel runs only on a CPU with AMX-BF16 whose OS lends the tiles",
)


def _unfused(x, packed, bias):
    gate, up = matmul_amx.linear(x, packed, bias).chunk(2, dim=-1)
    return silu_and_mul(gate, up)


@needs_amx
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 33, 100])
@pytest.mark.parametrize("inter_in", [(16, 32), (48, 96), (1536, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_equals_the_product_then_silu_and_mul(rows, inter_in, bias):
    # One block a half, an odd number of blocks a half (48 = 3), the SmolLM2 shape; row counts
    # around the 16-row tiles.
    inter, k = inter_in
    torch.manual_seed(rows * inter + k)
    x = torch.randn(rows, k).bfloat16()
    w = (torch.randn(2 * inter, k) * 0.2).bfloat16()
    b = torch.randn(2 * inter).bfloat16() if bias else None
    packed = matmul_amx.pack(w)
    got = matmul_amx.linear_silu_mul(x, packed, b)
    assert got.shape == (rows, inter) and got.dtype == torch.bfloat16
    assert torch.equal(got, _unfused(x, packed, b))
    # ... and that is SwiGLU on the product (whose own rounding test_native_amx_gemm checks):
    # torch's form, within the last bit of bf16 where the native exp and torch's differ.
    gate, up = matmul_amx.linear(x, packed, b).chunk(2, dim=-1)
    want = F.silu(gate) * up
    torch.testing.assert_close(got, want, atol=1e-6, rtol=2**-7)


@needs_amx
def test_strided_rows_leading_dims_and_specials():
    torch.manual_seed(3)
    w = torch.randn(64, 96).bfloat16()
    packed = matmul_amx.pack(w)
    wide = torch.randn(20, 200).bfloat16()
    x = wide[:, 40:136]
    assert torch.equal(matmul_amx.linear_silu_mul(x, packed, None), _unfused(x, packed, None))
    x = torch.randn(2, 3, 96).bfloat16()
    assert matmul_amx.linear_silu_mul(x, packed, None).shape == (2, 3, 32)
    x = torch.randn(3, 96).bfloat16()
    x[0, 0], x[1, 0] = float("inf"), float("nan")
    got, want = matmul_amx.linear_silu_mul(x, packed, None), _unfused(x, packed, None)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


@needs_amx
def test_halves_that_split_a_block_and_long_steps_take_the_unfused_path(monkeypatch):
    # 2 x 24 outputs: the halves meet inside a 16-output block, which the kernel refuses.
    torch.manual_seed(4)
    w = torch.randn(48, 64).bfloat16()
    packed = matmul_amx.pack(w)
    x = torch.randn(5, 64).bfloat16()
    with pytest.raises(RuntimeError, match="whole 16-output blocks"):
        amx_linear_silu_mul_kernel()(x, packed, None)
    assert torch.equal(matmul_amx.linear_silu_mul(x, packed, None), _unfused(x, packed, None))
    monkeypatch.setattr(matmul_amx, "ONEDNN_ROWS", 4)
    w = torch.randn(64, 64).bfloat16()
    packed = matmul_amx.pack(w)
    want = F.linear(x, w).chunk(2, dim=-1)
    assert torch.equal(matmul_amx.linear_silu_mul(x, packed, None), silu_and_mul(*want))


class _AddsOne(torch.nn.Module):
    """A stand-in LoRA term whose step uses adapters: it adds 1 to the product."""

    def __init__(self, active: bool) -> None:
        super().__init__()
        self.step = type("Step", (), {"token_slots": torch.zeros(1) if active else None})()

    def adds_to_product(self) -> bool:
        return self.step.token_slots is not None

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.step.token_slots is not None:
            y.add_(1.0)

    def linear(self, weight, x, bias, *, gated=None):  # LoraTerm.linear without the tile path
        y = weight(x, bias)
        self(x, y)
        return y if gated is None else act_and_mul(y, gated)


@needs_amx
def test_the_gate_up_layer_fuses_only_when_no_term_is_added_to_the_product():
    torch.manual_seed(5)
    w = (torch.randn(64, 96) * 0.2).bfloat16()
    layer = MergedColumnParallelLinear(DenseWeight(w), None, num_blocks=2)
    assert matmul_amx.is_packed(layer.weight.weight)
    x = torch.randn(4, 96).bfloat16()
    plain = silu_and_mul(*F.linear(x, w).chunk(2, dim=-1))
    assert torch.equal(layer.act_and_mul(x, "silu"), plain)
    layer.lora = _AddsOne(active=False)  # adapters loaded, none in this step
    assert torch.equal(layer.act_and_mul(x, "silu"), plain)
    layer.lora = _AddsOne(active=True)
    gate, up = (F.linear(x, w) + 1.0).chunk(2, dim=-1)
    assert torch.equal(layer.act_and_mul(x, "silu"), silu_and_mul(gate, up))
