"""The native rows kernel (shard/platforms/cpu/native/rows_gemm.cpp): a linear layer of a few
rows with bf16/fp16 weights on an AVX2 CPU, as decode and speculative verify steps run it.

Its results are the exact products summed in fp32 and rounded once, like any half-precision
GEMM's, and each row's result is bit for bit the same whatever rows share the call: a row in a
decode step of 1, of 5 or of a verify step's k + 1 rows gets the same logits, so the same greedy
token (speculative decoding's outputs equal the plain server's on a CPU in bf16 because of it).
"""

from __future__ import annotations

import pytest
import torch

from shard.platforms.cpu import matmul
from shard.platforms.cpu.native import build as native
from tests.shard.rounding import assert_rounded_once

KERNEL = native.rows_linear_kernel()
pytestmark = pytest.mark.skipif(
    KERNEL is None,
    # The same on a GPU machine: the kernel is the CPU's, for x86-64 CPUs with those flags.
    reason="the rows kernel needs an x86-64 CPU with AVX2, FMA and F16C and a C++ toolchain",
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [8, 96, 579])  # a K tail past the 8-wide body
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 32])
def test_rows_are_fp32_sums_rounded_once(dtype, k, rows):
    torch.manual_seed(rows * k)
    x = torch.randn(rows, k).to(dtype)
    w = (torch.randn(301, k) * 0.1).to(dtype)
    b = torch.randn(301).to(dtype)
    got = KERNEL(x, w, b)
    assert got.dtype == dtype and got.shape == (rows, 301)
    assert_rounded_once(got, x, w, b)
    assert_rounded_once(KERNEL(x, w, None), x, w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(dtype):
    torch.manual_seed(0)
    x = torch.randn(32, 576).to(dtype)
    w = (torch.randn(1000, 576) * 0.1).to(dtype)
    whole = KERNEL(x, w, None)
    for start, size in [(0, 1), (5, 1), (3, 4), (0, 5), (8, 9), (20, 12)]:
        part = KERNEL(x[start : start + size], w, None)
        assert torch.equal(part, whole[start : start + size]), (start, size)


def test_a_weight_with_a_row_stride_wider_than_its_rows():
    torch.manual_seed(1)
    wide = (torch.randn(64, 200) * 0.1).bfloat16()
    w = wide[:, 40:136]  # rows contiguous, stride 200
    x = torch.randn(5, 96).bfloat16()
    assert_rounded_once(KERNEL(x, w, None), x, w.contiguous())


def test_linear_takes_the_kernel_up_to_its_rows_on_a_cpu_without_half_dots(monkeypatch):
    monkeypatch.setattr(matmul, "_cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    calls = []

    def counted(*args):
        calls.append(args[0].shape[0])
        return KERNEL(*args)

    monkeypatch.setattr(native, "rows_linear_kernel", lambda: counted)
    w = torch.randn(48, 32).bfloat16()
    for rows in (1, matmul.ROWS_KERNEL_MAX, matmul.ROWS_KERNEL_MAX + 1):
        x = torch.randn(2, rows, 32).bfloat16()[0]
        assert matmul.linear(x, w).shape == (rows, 48)
    assert calls == [1, matmul.ROWS_KERNEL_MAX]
