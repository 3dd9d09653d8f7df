"""The decode step's small per-token ops as one Triton kernel each: RMSNorm with the residual add,
SwiGLU's silu(gate) * up, and the neox rotation of q and k.

Why: replayed from a CUDA graph, a 1B model's decode step at batch 1 took 1.6 ms against 0.8 ms
of weight bytes (docs/benchmarks.md), most of the difference being kernels too short to matter
alone: torch runs RMSNorm with its residual add as three kernels, the rotation as four and
SwiGLU as two, in each of 16 layers. One kernel each leaves the step's other kernels alone.

Each computes what the torch path computes (shard/layers/norm.py, rotary.py, activation.py) and
rounds where it rounds, so that outputs agree to the last bit but for the order of the norm's
sum of squares. Rows are one program each: a decode step has few, and a row of 8192 fits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shard.platforms.cuda.kernels import check_device


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    sum_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_s,
    n,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
        # Rounded to the dtype, as torch's add is, before the norm reads it.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * stride_s + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / n + eps)
    normed = (xf * inv).to(x_ptr.dtype.element_ty)  # Llama rounds before the scale
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    out = (w.to(tl.float32) * normed.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + offs, out, mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [T, N] (rows of unit stride) -> (weight * rmsnorm(x'), x') where x' = x + residual
    (rounded to x's dtype) with a residual, else x' = x and None in its place."""
    rows, n = x.shape
    check_device(x, weight)
    out = torch.empty_like(x, dtype=torch.promote_types(x.dtype, weight.dtype))
    summed = torch.empty_like(x) if residual is not None else None
    if rows:
        _rms_norm_kernel[(rows,)](
            x, residual if residual is not None else x, weight, out,
            summed if summed is not None else out,
            x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
            summed.stride(0) if summed is not None else 0, n, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n),
            num_warps=_warps(n),
        )  # fmt: skip
    return out, summed


@triton.jit
def _silu_mul_kernel(
    product_ptr, out_ptr, stride_p, stride_o, n, BLOCK: tl.constexpr
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gate = tl.load(product_ptr + row * stride_p + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(product_ptr + row * stride_p + n + offs, mask=mask, other=0.0)
    # torch rounds silu(gate) to the dtype, then the product.
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty)
    out = silu.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(product: torch.Tensor) -> torch.Tensor:
    """product [T, 2I] (gate then up, rows of unit stride) -> silu(gate) * up [T, I]."""
    rows, width = product.shape
    check_device(product)
    n = width // 2
    out = torch.empty(rows, n, dtype=product.dtype, device=product.device)
    block = min(1024, triton.next_power_of_2(max(n, 1)))
    if rows and n:
        _silu_mul_kernel[(rows, triton.cdiv(n, block))](
            product, out, product.stride(0), out.stride(0), n, BLOCK=block
        )
    return out


@triton.jit
def _rotary_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    positions_ptr,
    stride_xt,
    stride_xh,
    stride_table,
    heads,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < heads) & (d < HALF)
    dtype = x_ptr.dtype.element_ty
    # The tables over the rotated width 2 * HALF (rotary.py): cos for both halves, sin negated
    # for the first one, rounded to the dtype as the torch path rounds its gathered rows. A
    # head's dims past the rotated width (partial rotary) are neither read nor written.
    table = pos * stride_table + d
    cos1 = tl.load(cos_ptr + table, mask=d < HALF).to(dtype).to(tl.float32)
    cos2 = tl.load(cos_ptr + table + HALF, mask=d < HALF).to(dtype).to(tl.float32)
    sin1 = tl.load(sin_ptr + table, mask=d < HALF).to(dtype).to(tl.float32)
    sin2 = tl.load(sin_ptr + table + HALF, mask=d < HALF).to(dtype).to(tl.float32)
    row = x_ptr + token * stride_xt + h * stride_xh + d
    x1 = tl.load(row, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + HALF, mask=mask, other=0.0).to(tl.float32)
    # x * cos + roll(x) * sin, each product rounded, then the sum: as torch's three ops round.
    out1 = (x1 * cos1).to(dtype).to(tl.float32) + (x2 * sin1).to(dtype).to(tl.float32)
    out2 = (x2 * cos2).to(dtype).to(tl.float32) + (x1 * sin2).to(dtype).to(tl.float32)
    tl.store(row, out1.to(dtype), mask=mask)
    tl.store(row + HALF, out2.to(dtype), mask=mask)


def rotary_(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Rotates x [T, heads, D] (D contiguous) in place by the tables cos, sin [rows, R] at
    `positions` [T] (the tables' rows: longrope's long rows follow its short ones); R <= D, even:
    the first R dims of each head rotate, the rest are left as they are (partial rotary).
    Returns x."""
    tokens, heads, head_dim = x.shape
    check_device(x, cos, sin, positions)
    if x.stride(2) != 1 or cos.stride() != sin.stride() or cos.stride(1) != 1:
        raise ValueError("rotary_ needs unit-stride head dims and tables of one layout")
    rotary_dim = cos.shape[1]
    if cos.shape != sin.shape or rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(
            f"rotary_: tables {tuple(cos.shape)}, {tuple(sin.shape)} for heads of {head_dim}: "
            "they must be one shape, their width even and at most the head's"
        )
    half = rotary_dim // 2
    block_h = min(16, triton.next_power_of_2(heads))
    if tokens and heads:
        _rotary_kernel[(tokens, triton.cdiv(heads, block_h))](
            x, cos, sin, positions, x.stride(0), x.stride(1), cos.stride(0), heads,
            HALF=half, BLOCK_H=block_h, BLOCK_D=triton.next_power_of_2(half),
        )  # fmt: skip
    return x


def _warps(n: int) -> int:
    return 4 if n <= 2048 else 8
