"""The CPU int4 paths in bfloat16: torch's int4 kernel for few rows, dequantize + GEMM for many,
against the library-dequantized weights (the fp32 path is exact: test_quantized_models.py)."""

from __future__ import annotations

import pytest
import torch
from quant_fixtures import SERVED, fixture, quant_config, reference_weights, weights_at

from shard.layers.linear import ColumnParallelLinear, RowParallelLinear
from shard.layers.quant.int4_cpu import DENSE_MIN_ROWS, CpuInt4
from shard.layers.quant.int4_dequant import DequantizingInt4

KERNEL_READY = [n for n in SERVED if not quant_config(n).get("desc_act")]
ACT_ORDER = [n for n in SERVED if quant_config(n).get("desc_act")]
UP, DOWN = "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"


def _check(layer, weight: torch.Tensor, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, weight.shape[1], generator=gen).to(torch.bfloat16)
    got = layer(x)
    assert got.dtype == torch.bfloat16
    want = x.float() @ weight.float().T
    # Scales rounded to bf16 (8 bits) and the bf16 output: ~1% of the output's magnitude.
    scale = want.abs().max().item()
    torch.testing.assert_close(got.float(), want, atol=2e-2 * scale, rtol=2e-2)


@pytest.mark.parametrize("rows", [1, 7, DENSE_MIN_ROWS + 3])
@pytest.mark.parametrize("name", KERNEL_READY)
def test_bf16_runs_torch_int4_kernel_and_dense_path_within_bf16_error(name, rows):
    weights, ref = weights_at(fixture(name), dtype=torch.bfloat16), reference_weights(name)
    up = ColumnParallelLinear.load(weights, UP, bias=False)
    down = RowParallelLinear.load(weights, DOWN, bias=False)
    for layer, prefix in ((up, UP), (down, DOWN)):
        assert isinstance(layer.weight, CpuInt4), prefix
        # One packed copy: the dense path reads the kernel's own packing back.
        assert layer.weight.own_layout and layer.weight.qweight is None
        _check(layer, ref[f"{prefix}.weight"], rows)


@pytest.mark.parametrize("name", ACT_ORDER)
def test_act_order_dequantizes_in_bf16(name):
    """Rows of a group are scattered: torch's kernel cannot take that, the dense path can."""
    weights, ref = weights_at(fixture(name), dtype=torch.bfloat16), reference_weights(name)
    down = RowParallelLinear.load(weights, DOWN, bias=False)
    assert type(down.weight) is DequantizingInt4
    _check(down, ref[f"{DOWN}.weight"], 5)


def test_kernel_and_dense_paths_agree_on_the_same_rows():
    name = KERNEL_READY[0]
    layer = ColumnParallelLinear.load(
        weights_at(fixture(name), dtype=torch.bfloat16), UP, bias=False
    )
    x = torch.randn(DENSE_MIN_ROWS, layer.weight.in_features).to(torch.bfloat16)
    dense = layer(x)  # DENSE_MIN_ROWS rows: dequantize + GEMM
    kernel = torch.cat([layer(x[i : i + 1]) for i in range(0, DENSE_MIN_ROWS, 17)])
    torch.testing.assert_close(
        kernel.float(), dense[::17].float(), atol=2e-2 * dense.abs().max().item(), rtol=2e-2
    )
