"""The native greedy choice (shard/platforms/cpu/native/argmax.cpp) must be torch.argmax's, index
for index: ties go to the first maximum, a NaN beats every number (the first NaN wins), and rows of
-inf or +inf pick as torch picks."""

from __future__ import annotations

import pytest
import torch

import shard.platforms.cpu.native.build
from shard.platforms.cpu.native.build import argmax_kernel, unavailable_reason
from shard.sampling.sampler import greedy_ids

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(
    REASON is not None, reason=f"the native kernels cannot be built here: {REASON}"
)
INF = float("inf")


def _rows(width: int) -> torch.Tensor:
    torch.manual_seed(width)
    x = torch.randn(12, width)
    x[1] = torch.randint(0, 3, (width,)).float()  # many ties of the maximum
    x[2] = -INF  # every value -inf
    x[3, width // 2 :] = INF  # ties of +inf
    x[4, width - 1] = float("nan")  # a NaN at the end
    if width > 2:
        x[5, 1] = x[5, width - 2] = float("nan")  # two NaNs: the first wins
    x[6] = 0.0  # all equal
    x[7, width - 1] = 1e30  # the maximum in the last lane of a tail
    x[8] = torch.randn(width).half().float()  # coarse values: ties far apart
    return x


@pytest.mark.parametrize("width", [1, 2, 15, 16, 17, 33, 1000, 49152])
def test_argmax_is_torchs_choice(width):
    x = _rows(width)
    assert torch.equal(argmax_kernel()(x), x.argmax(dim=1))
    strided = torch.cat([x, torch.full_like(x, 1e38)], dim=1)[:, :width]  # row stride 2 x width
    assert torch.equal(argmax_kernel()(strided), x.argmax(dim=1))


def test_argmax_refuses_what_it_cannot_take():
    with pytest.raises(RuntimeError, match="float32"):
        argmax_kernel()(torch.randn(2, 8).double())
    with pytest.raises(RuntimeError, match="contiguous rows"):
        argmax_kernel()(torch.randn(8, 2).t())
    with pytest.raises(RuntimeError, match="V > 0"):
        argmax_kernel()(torch.empty(2, 0))


def test_sampler_takes_the_native_choice(monkeypatch):
    real, calls = argmax_kernel(), []
    monkeypatch.setattr(
        shard.platforms.cpu.native.build,
        "argmax_kernel",
        lambda: lambda x: calls.append(x) or real(x),
    )
    x = _rows(100)
    assert torch.equal(greedy_ids(x), x.argmax(dim=1)) and len(calls) == 1
    assert torch.equal(greedy_ids(x.double()), x.argmax(dim=1)) and len(calls) == 1  # torch's
