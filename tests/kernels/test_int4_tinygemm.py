"""CUDA int4 weights (shard/layers/quant/int4_cuda.py): tinygemm for decode-sized bf16 row counts,
the Triton W4A16 GEMM beyond (and for fp16), each against the weight's own dequantization.

On a CPU only what does not need CUDA runs: which weights tinygemm takes, and the byte order
handed to its packer, checked through torch's CPU int4 kernel, whose semantics ((code - 8) *
scale + zero per group) tinygemm shares. With a CUDA device the layer itself runs at 1-16 rows.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_w4a16 import random_weight

from shard.layers.quant import tinygemm
from shard.layers.quant.int4_cuda import TINYGEMM_MAX_ROWS, CudaInt4, cuda_group_size, pack_for_cuda

CUDA = torch.cuda.is_available()
NO_CUDA = "tinygemm's CUDA kernel (aten._weight_int4pack_mm) needs a CUDA device"


def test_tinygemm_takes_grouped_weights_on_its_tiles_only():
    gen = torch.Generator().manual_seed(0)
    assert cuda_group_size(random_weight(256, 64, 128, gen)) == 128
    assert cuda_group_size(random_weight(256, 64, 256, gen)) == 256  # one group per channel
    assert cuda_group_size(random_weight(256, 64, 128, gen, act_order=True)) is None
    assert cuda_group_size(random_weight(192, 64, 64, gen)) is None  # K off its 128-row tiles
    assert cuda_group_size(random_weight(256, 40, 128, gen)) is None  # N off its tiles
    assert cuda_group_size(random_weight(256, 64, 96, gen)) is None  # a group size it lacks


def test_the_packed_bytes_hold_even_rows_high_and_odd_rows_low():
    codes = torch.tensor([[1, 2, 3, 4], [15, 0, 7, 9]])
    assert pack_for_cuda(codes).tolist() == [[0x12, 0x34], [0xF0, 0x79]]


def test_scales_and_zeros_give_the_weights_dequantization_on_the_cpu_kernel():
    # The CPU kernel reads the same scale/zero table as the CUDA one (tinygemm.scale_zero).
    gen = torch.Generator().manual_seed(1)
    qw = random_weight(256, 64, 128, gen, scale_dtype=torch.bfloat16)
    group = tinygemm.group_size(qw)
    codes = torch.ops.aten._convert_weight_to_int4pack_for_cpu(qw.codes().T.contiguous().int(), 1)
    x = torch.randn(3, 256, generator=gen).bfloat16()
    table = tinygemm.scale_zero(qw, group).bfloat16()
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(x, codes, group, table)
    want = x.float() @ qw.dequantize(torch.float32)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, TINYGEMM_MAX_ROWS, TINYGEMM_MAX_ROWS + 1, 16])
@pytest.mark.parametrize("act_order", [False, True])
def test_cuda_int4_equals_the_dequantized_weight(dtype, rows, act_order):
    gen = torch.Generator().manual_seed(rows)
    qw = random_weight(512, 256, 128, gen, act_order=act_order)
    device = torch.device("cuda")
    on_device = dataclasses.replace(
        qw,
        qweight=qw.qweight.to(device),
        zeros=qw.zeros.to(device),
        scales=qw.scales.to(device),
        g_idx=None if qw.g_idx is None else qw.g_idx.to(device),
    )
    layer = CudaInt4(on_device)
    assert (layer.tiny_group_size is not None) == (not act_order)
    x = torch.randn(rows, 512, generator=gen).to(dtype)
    bias = torch.randn(256, generator=gen).to(dtype)
    got = layer(x.to(device), bias.to(device)).cpu()
    assert got.dtype == dtype and got.shape == (rows, 256)
    want = x.float() @ qw.dequantize(torch.float32) + bias.float()
    tolerance = 2e-2 if dtype == torch.bfloat16 else 2e-3  # fp16 rows never reach tinygemm
    torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)
