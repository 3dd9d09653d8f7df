"""The bound a half-precision GEMM's result must meet: exact products, fp32 sums, one rounding."""

import torch
import torch.nn.functional as F


def assert_rounded_once(
    got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
) -> None:
    """got is the exact x @ w.T + b rounded once to got's dtype, up to fp32 accumulation: within
    half a unit in the last place of the exact value, plus the fp32 summation's error bound.

    Not bit-equal to one fp32 GEMM: BLAS libraries sum in an order that depends on how they block
    the output columns (MKL on Intel differs between a 1024-column chunk and the whole 2500), so
    two correct fp32 GEMMs can straddle a rounding boundary of the narrower dtype."""
    if b is None:
        b = torch.zeros(w.shape[0], dtype=w.dtype)
    x64, w64, b64 = x.double(), w.double(), b.double()
    exact = F.linear(x64, w64, b64)
    magnitude = F.linear(x64.abs(), w64.abs(), b64.abs())
    accumulation = (x.shape[-1] + 1) * torch.finfo(torch.float32).eps * magnitude
    info = torch.finfo(got.dtype)
    exponent = torch.floor(torch.log2(exact.abs().clamp(min=info.tiny)))
    half_ulp = 0.5 * info.eps * torch.exp2(exponent)
    error = (got.double() - exact).abs()
    assert bool((error <= half_ulp + accumulation).all()), float((error - half_ulp).max())
