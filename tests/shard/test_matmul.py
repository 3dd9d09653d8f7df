"""The CPU matmul dispatch computes what a half-precision GEMM computes, widened or not."""

import pytest
import torch
import torch.nn.functional as F

from shard.platforms.cpu import matmul
from shard.platforms.cpu.native import build as native
from tests.shard.rounding import assert_rounded_once


@pytest.fixture
def no_native_half(monkeypatch):
    monkeypatch.setattr(matmul, "_cpu_flags", lambda: frozenset({"avx2", "fma"}))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 3, 4, 17])
@pytest.mark.parametrize("out_features", [7, 1024, 2500])
def test_widened_linear_matches_fp32_math_rounded_to_dtype(
    no_native_half, dtype, rows, out_features
):
    torch.manual_seed(rows * out_features)
    x = torch.randn(rows, 96).to(dtype)
    w = (torch.randn(out_features, 96) * 0.1).to(dtype)
    b = torch.randn(out_features).to(dtype)
    got = matmul.linear(x, w, b)
    assert got.dtype == dtype and got.shape == (rows, out_features)
    rows_kernel = native.rows_linear_kernel() is not None and rows <= matmul.ROWS_KERNEL_MAX
    if rows >= matmul.WIDEN_MIN_ROWS or rows_kernel:
        # Exact products of the half-precision values, accumulated in fp32, rounded once.
        assert_rounded_once(got, x, w, b)
    else:
        torch.testing.assert_close(got, F.linear(x, w, b), atol=0, rtol=0)


def test_leading_dims_are_kept(no_native_half):
    x = torch.randn(2, 5, 32).bfloat16()
    w = torch.randn(48, 32).bfloat16()
    assert matmul.linear(x, w).shape == (2, 5, 48)
    torch.testing.assert_close(
        matmul.linear(x, w), F.linear(x.float(), w.float()).bfloat16(), atol=0, rtol=0
    )


def test_native_half_and_fp32_go_straight_to_torch(monkeypatch):
    monkeypatch.setattr(matmul, "_cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16"}))
    assert not matmul._widen_on_cpu(torch.bfloat16)
    assert matmul._widen_on_cpu(torch.float16)
    assert not matmul._widen_on_cpu(torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [0, 1, 5, 16, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_prepared_weights_compute_what_plain_weights_compute(dtype, rows, bias):
    torch.manual_seed(rows)
    w = (torch.randn(1100, 96) * 0.1).to(dtype)
    b = torch.randn(1100).to(dtype) if bias else None
    x = torch.randn(3, rows, 96).to(dtype)  # leading dims kept
    prepared = matmul.prepare_weight(w)
    # Packed where this CPU has a native GEMM for the dtype (fp32 wherever torch has oneDNN;
    # bf16 with AVX512-BF16/AMX), else the weight itself, which the widening path multiplies:
    # either way the same matrix and the same products.
    native = torch.backends.mkldnn.is_available() and not matmul._widen_on_cpu(dtype)
    assert prepared.is_mkldnn == native and (native or prepared is w)
    assert prepared.shape == w.shape and torch.equal(matmul.dense(prepared), w)
    got = matmul.linear(x, prepared, b)
    assert got.dtype == dtype and got.shape == (3, rows, 1100)
    # Same products and fp32 accumulation, possibly summed in another order.
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got, F.linear(x, w, b), atol=tol, rtol=tol)


def test_nothing_is_packed_where_the_cpu_widens_half_precision(no_native_half):
    w = torch.randn(8, 8).bfloat16()
    assert matmul.prepare_weight(w) is w
    assert matmul.dense(w) is w
