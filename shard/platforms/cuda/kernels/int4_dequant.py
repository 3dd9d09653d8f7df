"""Dequantizing int4 codes in registers: a device function of the W4A16 GEMM (w4a16.py), and a
kernel that writes a whole dense weight (for many rows' GEMMs through cuBLAS)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shard.platforms.cuda.kernels import check_device

EXPONENT_2P23 = 0x4B000000  # the fp32 bits of 2^23, the kernel's `exponent` argument


@triton.jit
def codes_minus_zeros(packed, zeros, exponent, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_K // 8] int32 words -> [BLOCK_N, BLOCK_K] fp32 (code - zero), exact.

    Code k is nibble j = k % 8 of word k // 8. Nibbles 4..7 are first moved down by one shift
    per word, so every code sits at bit 4j' (j' = j % 4) of a word: masking it in place under
    the exponent bits of 2^23 gives the float 2^23 + code * 2^(4j') (one LOP3), and
    fma(that, 2^-4j', -(2^(23-4j') + zero)) = code - zero exactly (one FFMA: every term is an
    integer below 2^24). The masks and powers of two are per-register constants once unrolled.
    `zeros` are integers (any shape broadcasting to the tile), turned into 2^23 + zero the same
    way, without an int-to-float conversion.

    `exponent` is 0x4B000000 (the bits of 2^23) passed at run time: as a literal, LLVM folds it
    into every per-code mask and ptxas then rematerialises it in a register for each LOP3
    (~5% more instructions in the loop, seen in the sm_90 SASS).
    """
    high = (packed.to(tl.uint32, bitcast=True) >> 16).to(tl.int32, bitcast=True)
    # Per word: low, low, low, low, high, high, high, high.
    words = tl.interleave(packed | exponent, high | exponent)
    words = tl.interleave(words, words)
    words = tl.interleave(words, words)
    nib = tl.arange(0, BLOCK_K) % 4
    in_place = (words & (exponent | (0xF << (nib * 4)))[None, :]).to(tl.float32, bitcast=True)
    down = ((127 - 4 * nib) << 23).to(tl.float32, bitcast=True)  # 2^-4j'
    offset = 8388608.0 - ((150 - 4 * nib) << 23).to(tl.float32, bitcast=True)  # 2^23 - 2^(23-4j')
    zero_2p23 = (zeros.to(tl.int32) | exponent).to(tl.float32, bitcast=True)  # 2^23 + zero
    return tl.fma(in_place, down[None, :], offset[None, :] - zero_2p23)


@triton.jit
def _dequantize_kernel(
    qweight_ptr,
    scales_ptr,
    zeros_ptr,
    g_idx_ptr,
    out_ptr,
    N,
    K,
    stride_qk,
    stride_qn,
    stride_sg,
    stride_sn,
    stride_zg,
    stride_zn,
    stride_ok,
    stride_on,
    exponent,
    GROUP_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ACT_ORDER: tl.constexpr,
):
    # One [BLOCK_K, BLOCK_N] tile of the dense weight per program: the packed words are read
    # once, each output element written once, (code - zero) * scale in fp32 rounded once.
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    words = tl.program_id(1) * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
    n_mask = offs_n < N
    k_mask = ks < K
    rows_n = offs_n.to(tl.int64)
    packed = tl.load(
        qweight_ptr + words[None, :] * stride_qk + rows_n[:, None] * stride_qn,
        mask=n_mask[:, None] & (words[None, :] < K // 8),
        other=0,
    )
    k_safe = tl.minimum(ks, K - 1)
    if ACT_ORDER:
        g = tl.load(g_idx_ptr + k_safe)
    else:
        g = k_safe // GROUP_SIZE
    meta_mask = n_mask[:, None] & k_mask[None, :]
    s = tl.load(scales_ptr + g[None, :] * stride_sg + rows_n[:, None] * stride_sn, mask=meta_mask)
    z = tl.load(zeros_ptr + g[None, :] * stride_zg + rows_n[:, None] * stride_zn, mask=meta_mask)
    w = codes_minus_zeros(packed, z, exponent, BLOCK_K) * s.to(tl.float32)  # [BLOCK_N, BLOCK_K]
    o_ptrs = out_ptr + ks[None, :].to(tl.int64) * stride_ok + rows_n[:, None] * stride_on
    tl.store(o_ptrs, w.to(out_ptr.dtype.element_ty), mask=meta_mask)


def dequantize_int4(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor | None,
    group_size: int,
    dtype: torch.dtype,
    *,
    block_n: int = 64,
    block_k: int = 64,
) -> torch.Tensor:
    """The int4 weight of `shard.layers.quant.int4`'s layout (qweight int32 [K // 8, N], scales
    and integer zeros [G, N], g_idx int32 [K] or None) as a dense [K, N] tensor of `dtype`:
    (code - zero) * scale formed in fp32 and rounded once, as QuantizedWeight.dequantize
    forms it. Many rows' GEMMs run faster on it through cuBLAS than through a kernel that
    dequantizes per output tile, and one pass over the weight costs about what a few decode
    steps' reads of it do.
    """
    k_words, n = qweight.shape
    k = k_words * 8
    if qweight.dtype != torch.int32:
        raise ValueError(f"qweight must be int32, got {qweight.dtype}")
    if zeros.shape != scales.shape or scales.dim() != 2 or scales.shape[1] != n:
        raise ValueError(
            f"scales {tuple(scales.shape)} and zeros {tuple(zeros.shape)} must both be [G, {n}]"
        )
    if zeros.dtype.is_floating_point or zeros.dtype == torch.bool:
        raise ValueError(f"zeros must be integer zero points, got {zeros.dtype}")
    if g_idx is None and scales.shape[0] < -(-k // group_size):
        raise ValueError(f"{scales.shape[0]} groups of {group_size} do not cover {k} rows")
    if g_idx is not None and (g_idx.shape != (k,) or g_idx.dtype != torch.int32):
        raise ValueError(f"g_idx must be int32 [{k}], got {g_idx.dtype} {tuple(g_idx.shape)}")
    out = torch.empty(k, n, dtype=dtype, device=qweight.device)
    if k == 0 or n == 0:
        return out
    check_device(qweight, scales, zeros, *([] if g_idx is None else [g_idx]))
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    _dequantize_kernel[grid](
        qweight,
        scales,
        zeros,
        qweight if g_idx is None else g_idx,  # a dummy when ACT_ORDER is off: never read
        out,
        n,
        k,
        *qweight.stride(),
        *scales.stride(),
        *zeros.stride(),
        *out.stride(),
        EXPONENT_2P23,
        GROUP_SIZE=group_size,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        ACT_ORDER=g_idx is not None,
    )
    return out
