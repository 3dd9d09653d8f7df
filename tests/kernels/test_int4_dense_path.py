"""Int4 weights at many rows (shard/layers/quant/int4_triton.py): the weight dequantized in one
pass by the Triton kernel (int4_dequant.dequantize_int4), then a dense GEMM.

The dense weight must be exactly what QuantizedWeight.dequantize forms ((code - zero) * scale in
fp32, rounded once to the dtype): bit for bit in fp32 and fp16. In bf16 the interpreter's fp32 to
bf16 conversion truncates where a GPU rounds to nearest even (see test_w4a16.py), so the
expected tensor is the fp32 one truncated there and rounded on a GPU: either way equality.
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE
from test_w4a16 import TOLERANCES, on_device, random_weight

from shard.layers.quant import int4_triton
from shard.layers.quant.int4 import QuantizedWeight
from shard.layers.quant.int4_triton import DEQUANT_MIN_ROWS, TritonInt4
from shard.platforms.cuda.kernels import int4_dequant, interpreting
from shard.platforms.cuda.kernels.int4_dequant import dequantize_int4

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def expected_dense(qw: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    exact = qw.dequantize(torch.float32)
    if dtype == torch.bfloat16 and interpreting():
        return (exact.view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)  # truncated
    return exact.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("k", "n", "group_size", "act_order"),
    [
        (128, 96, 32, False),
        (200, 70, 64, False),  # K off the 64-row tile, N off the 64-column one, a short last group
        (256, 64, 128, True),  # act-order: each row's group from g_idx
        (96, 33, 96, False),  # one group per channel
    ],
)
def test_dequantized_weight_is_the_reference_bit_for_bit(dtype, k, n, group_size, act_order):
    gen = torch.Generator().manual_seed(k + n)
    qw = on_device(random_weight(k, n, group_size, gen, act_order=act_order))
    got = dequantize_int4(qw.qweight, qw.scales, qw.zeros, qw.g_idx, group_size, dtype)
    assert got.dtype == dtype and got.shape == (k, n)
    assert torch.equal(got.cpu(), expected_dense(qw, dtype).cpu())


def test_a_column_slice_of_the_packed_weight_dequantizes_as_those_columns():
    gen = torch.Generator().manual_seed(3)
    qw = on_device(random_weight(128, 200, 32, gen))
    cols = slice(70, 150)  # strided views of qweight, scales and zeros
    got = dequantize_int4(
        qw.qweight[:, cols], qw.scales[:, cols], qw.zeros[:, cols], None, 32, torch.float16
    )
    assert torch.equal(got.cpu(), qw.dequantize(torch.float16)[:, cols].cpu())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda qw: dict(qweight=qw.qweight.float()), "qweight must be int32"),
        (lambda qw: dict(zeros=qw.zeros.float()), "zeros must be integer"),
        (lambda qw: dict(scales=qw.scales[:, :8], zeros=qw.zeros[:, :8]), r"must both be \[G"),
        (lambda qw: dict(scales=qw.scales[:1], zeros=qw.zeros[:1]), "do not cover"),
        (lambda qw: dict(g_idx=torch.zeros(3, dtype=torch.int32)), "g_idx must be int32"),
    ],
)
def test_operands_it_cannot_read_are_refused(change, message):
    gen = torch.Generator().manual_seed(4)
    qw = random_weight(64, 16, 32, gen)
    args = dict(qweight=qw.qweight, scales=qw.scales, zeros=qw.zeros, g_idx=None) | change(qw)
    with pytest.raises(ValueError, match=message):
        dequantize_int4(**args, group_size=32, dtype=torch.float16)


def spy_dequantize(monkeypatch) -> list[tuple[int, int]]:
    """Records the (K, N) of each weight the dense path dequantizes."""
    calls: list[tuple[int, int]] = []
    real = int4_dequant.dequantize_int4

    def spy(qweight, *args, **kwargs):
        calls.append((qweight.shape[0] * 8, qweight.shape[1]))
        return real(qweight, *args, **kwargs)

    monkeypatch.setattr(int4_dequant, "dequantize_int4", spy)
    return calls


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act_order", [False, True])
def test_many_rows_take_the_dense_path_and_equal_the_reference(monkeypatch, dtype, act_order):
    calls = spy_dequantize(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    qw = random_weight(128, 48, 32, gen, act_order=act_order)
    layer = TritonInt4(on_device(qw))
    bias = torch.randn(48, generator=gen).to(dtype)
    x = torch.randn(2, DEQUANT_MIN_ROWS // 2, 128, generator=gen).to(dtype)  # [batch, seq, K]
    out = layer(x.to(DEVICE), bias.to(DEVICE)).cpu()
    assert calls == [(128, 48)]
    assert out.shape == (2, DEQUANT_MIN_ROWS // 2, 48) and out.dtype == dtype
    want = x.float() @ qw.dequantize() + bias.float()
    torch.testing.assert_close(out.float(), want, **TOLERANCES[dtype])


def test_fewer_rows_take_the_triton_gemm(monkeypatch):
    calls = spy_dequantize(monkeypatch)
    gen = torch.Generator().manual_seed(6)
    qw = random_weight(128, 48, 32, gen)
    x = torch.randn(DEQUANT_MIN_ROWS - 1, 128, generator=gen)
    out = TritonInt4(on_device(qw))(x.to(DEVICE)).cpu()
    assert calls == []
    torch.testing.assert_close(out, x @ qw.dequantize(), **TOLERANCES[torch.float32])


def test_a_large_weight_is_dequantized_in_column_slices(monkeypatch):
    calls = spy_dequantize(monkeypatch)
    monkeypatch.setattr(int4_triton, "DENSE_SLICE_ELEMENTS", 128 * 128)  # 128 columns of K=128
    gen = torch.Generator().manual_seed(7)
    qw = random_weight(128, 300, 32, gen)
    x = torch.randn(DEQUANT_MIN_ROWS, 128, generator=gen).half()
    out = TritonInt4(on_device(qw))(x.to(DEVICE)).cpu()
    assert calls == [(128, 128), (128, 128), (128, 44)]
    # each slice's GEMM is the whole one's columns: the same sums over K
    whole = (x.to(DEVICE) @ on_device(qw).dequantize(torch.float16)).cpu()
    torch.testing.assert_close(out, whole, atol=0, rtol=0)
