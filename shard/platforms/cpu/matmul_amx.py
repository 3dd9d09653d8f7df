"""bf16 linear layers on the CPU's AMX tile unit (shard/platforms/cpu/native/amx_gemm.cpp), eager
mode.

A decode step's GEMMs multiply a few rows by every weight once: they are bound by reading the
weights, and oneDNN's packed bf16 GEMM reads them at ~20-33 GB/s here where the memory gives
~45-50 (bench/amx_gemm.py). The kernel streams a weight laid out block by block as the tile
unit reads it: 1.3-1.4x faster than oneDNN from 1 to 32 rows, 1.04-1.9x up to 1,536. Past
that, at long prefills (compute-bound), oneDNN's cache blocking wins: steps of `ONEDNN_ROWS`
rows or more (a long prompt without chunking; the CPU default chunks are 64-256 tokens) hand
oneDNN the plain weight, unpacked for the call. That is ~1.2x slower than oneDNN on its own
packed copy would be (which would double the weights' memory).

The layout is a plain bf16 tensor [N/16, K/32, 16, 16, 2]: block (b, t) holds output features
b*16.. by inputs t*32.., each of its 16 rows the 16 outputs' VNNI pairs of inputs (2r, 2r+1).
Five dimensions mark it: every other weight a linear holds is [out, in]. Weights whose shape
does not tile (out % 16, in % 32) keep oneDNN's layout.
"""

from __future__ import annotations

import torch

from shard.platforms.cpu.native.build import (
    amx_linear_kernel,
    amx_linear_silu_mul_kernel,
    silu_mul_kernel,
)

BLOCK_OUT = 16  # output features per block
BLOCK_IN = 32  # input features per block (16 VNNI pairs)
# From here oneDNN on the unpacked weight is faster (30 cold layers of the SmolLM2 shape, ad hoc:
# 2,048 rows 216 against 258 ms, 4,096 rows 374 against ~485; below it the kernel is: 1,536
# rows 189 against 196, 1,024 rows 132 against 180).
ONEDNN_ROWS = 2048


def can_pack(weight: torch.Tensor) -> bool:
    """Whether `weight` [out, in] goes to the AMX kernel: bf16, shapes that tile, and a CPU
    (and OS, and build) that runs it."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.shape[0] % BLOCK_OUT == 0
        and weight.shape[1] % BLOCK_IN == 0
        and weight.numel() > 0
        and amx_linear_kernel() is not None
    )


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> [out/16, in/32, 16, 16, 2], with
    packed[b, t, r, j, p] = weight[16b + j, 32t + 2r + p]."""
    n, k = weight.shape
    blocks = weight.detach().reshape(n // BLOCK_OUT, BLOCK_OUT, k // BLOCK_IN, BLOCK_IN // 2, 2)
    return blocks.permute(0, 2, 3, 1, 4).contiguous()


def is_packed(weight: torch.Tensor) -> bool:
    return weight.dim() == 5 and weight.shape[2:] == (BLOCK_IN // 2, BLOCK_OUT, 2)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The [out, in] weight `pack` was given."""
    nb, kb = packed.shape[:2]
    return packed.permute(0, 3, 1, 2, 4).reshape(nb * BLOCK_OUT, kb * BLOCK_IN)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    kernel = amx_linear_kernel()  # None: SWITCHYARD_CPU_AMX=0 set after the weight was packed
    if kernel is None or x.numel() >= ONEDNN_ROWS * x.shape[-1]:
        return torch.nn.functional.linear(x, unpack(packed), bias)
    return _rows_call(kernel, x, packed, bias)


def linear_silu_mul(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """silu(gate) * up of a packed fused gate_up weight (its first half of outputs the gate's):
    the kernel applies SwiGLU as it rounds each tile of the product, which is then never
    written whole and read back (a 944-token prefill of the SmolLM2 shape: 0.57 ms a layer of
    SiLU-and-mul over a 5.8 MB product). The same values as swiglu(linear(...))."""
    kernel = amx_linear_silu_mul_kernel()
    if kernel is None or x.numel() >= ONEDNN_ROWS * x.shape[-1] or packed.shape[0] % 2:
        return _silu_mul(linear(x, packed, bias))
    return _rows_call(kernel, x, packed, bias)


def _rows_call(kernel, x, packed, bias):  # type: ignore[no-untyped-def]
    """kernel(x as [rows, features] with contiguous rows, packed, bias), shaped back as x."""
    if x.dim() == 2 and x.stride(-1) == 1:  # the usual [tokens, features]: no reshapes
        return kernel(x, packed, bias)
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = kernel(rows, packed, bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _silu_mul(product: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused product, as the layers' swiglu computes it on the CPU (the
    native pass, or torch's two ops where it does not apply)."""
    gate, up = product.chunk(2, dim=-1)
    kernel = silu_mul_kernel()
    if kernel is None or product.dim() != 2 or product.stride(-1) != 1:
        return torch.nn.functional.silu(gate) * up
    return kernel(gate, up)  # type: ignore[no-any-return]
