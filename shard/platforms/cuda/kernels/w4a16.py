"""W4A16 GEMM: out[M, N] = x[M, K] @ W[K, N] for int4 weights in the one internal layout of
`shard.layers.quant.int4` (codes packed 8 per int32 along K, integer zero points and scales per
group, optional act-order g_idx), dequantized in registers, accumulated in fp32.

Its FP8 variant (FP8_WEIGHT, `fp8_matmul`) is the W8A16 GEMM of `shard.layers.quant.fp8`'s
form: the [N, K] float8_e4m3fn weight read as stored (W^T, K contiguous), converted exactly to
fp32 and scaled per (output, K block), a block playing the part of a group; no zero points.
Everything else (tiles, split-K, scales after the dot for decode) is shared.

The kernel computes the transpose, out^T[N, M] = W^T[N, K] @ x^T[K, M], so that the dequantized
weight tile is the *left* operand of the tile matmul. A Hopper wgmma takes its left operand from
registers and its right one from shared memory: with the weight on the left, triton keeps the
dequantized tile in registers and overlaps each wgmma with the next tile's dequantization (one
wgmma left in flight); with the weight on the right it stores the tile to shared memory and
waits for every wgmma (both seen in the sm_90 TTGIR). x^T is the right operand, which also
suits decode: a wgmma's N can be as small as 8, so 1..16 tokens are one 16-wide tile.

Dequantization (`int4_dequant.py`) never converts int to float (sm_90 converts at a quarter
of the FMA rate): a code is masked into the mantissa of 2^23 and one FFMA gives code - zero,
exactly. Scales are applied one of two ways (compile-time SCALE_AFTER_DOT):
  - on the weight, ((c - z) * s) rounded to x's dtype, then the tile matmul (prefill: a cost
    per weight element, amortised over BLOCK_M tokens);
  - on the [BLOCK_N, BLOCK_M] product of a K tile that lies in one group (decode: no multiply
    per weight element, and c - z is exact in fp16/bf16, so only the fp32 accumulation rounds).
Groups: one group per K tile when BLOCK_K divides group_size (one row of scales per tile), else
(ROW_GROUPS) a group per row, k // group_size or g_idx[k] (act-order), gathered per element.

Split-K (SPLIT_K > 1, when the output tiles alone would leave SMs idle): split s writes its fp32
partial tile to `partials[s]`; the last split of a tile to arrive (a per-tile counter) sums all
of them in split order, so the result does not depend on the order of arrival, writes the
output and resets the counter to 0 for the next launch: one launch, no memset, no reduce kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shard.platforms.cuda.kernels import check_device, dot_options, interpreting
from shard.platforms.cuda.kernels.decode import num_sms
from shard.platforms.cuda.kernels.int4_dequant import EXPONENT_2P23, codes_minus_zeros
from shard.platforms.cuda.kernels.w4a16_config import (
    W4A16Config,
    check_tile,
    choose_split_k,
    default_config,
)

PACK = 8  # 4-bit codes per int32 word (shard.layers.quant.int4.PACK)


@triton.jit
def _w4a16_kernel(
    x_ptr,
    qweight_ptr,
    scales_ptr,
    zeros_ptr,
    g_idx_ptr,
    out_ptr,
    partials_ptr,
    counters_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_qk,
    stride_qn,
    stride_sg,
    stride_sn,
    stride_zg,
    stride_zn,
    stride_om,
    stride_on,
    exponent,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    ROW_GROUPS: tl.constexpr,
    ACT_ORDER: tl.constexpr,
    SCALE_AFTER_DOT: tl.constexpr,
    EVEN_K: tl.constexpr,
    FP8_WEIGHT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    # Tiles in groups of GROUP_M along M so that programs running together share weight tiles
    # in L2 (triton's matmul tutorial ordering); a no-op for decode (one M tile).
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = pid // per_group * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    pid_k = tl.program_id(1)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_w = tl.arange(0, BLOCK_K // 8)
    m_mask = offs_m < M
    n_mask = offs_n < N
    # Rows past M/N are clamped, not masked: they load real data that is never stored, which
    # keeps every load in the hot loop unmasked (and so vectorised and pipelined).
    rows_m = tl.minimum(offs_m, M - 1).to(tl.int64)
    rows_n = tl.minimum(offs_n, N - 1).to(tl.int64)

    x_base = x_ptr + rows_m[None, :] * stride_xm  # x^T tile [BLOCK_K, BLOCK_M]
    # W^T int4 words [BLOCK_N, BLOCK_K // 8] or FP8 values [BLOCK_N, BLOCK_K]
    q_base = qweight_ptr + rows_n[:, None] * stride_qn
    s_base = scales_ptr + rows_n * stride_sn
    z_base = zeros_ptr + rows_n * stride_zn

    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_begin = pid_k * tiles_per_split * BLOCK_K
    k_end = tl.minimum(k_begin + tiles_per_split * BLOCK_K, K)

    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        ks = k0 + offs_k
        if EVEN_K:
            xt = tl.load(x_base + ks[:, None] * stride_xk)
        else:
            # Past K: x reads 0 so whatever the weight holds there adds nothing.
            xt = tl.load(x_base + ks[:, None] * stride_xk, mask=ks[:, None] < K, other=0.0)
        if FP8_WEIGHT:  # W^T [BLOCK_N, BLOCK_K] as stored; FP8 to fp32 is exact
            if EVEN_K:
                values = tl.load(q_base + ks[None, :] * stride_qk)
            else:
                values = tl.load(q_base + ks[None, :] * stride_qk, mask=ks[None, :] < K, other=0.0)
            values = values.to(tl.float32)
        else:
            words = k0 // 8 + offs_w
            if EVEN_K:
                packed = tl.load(q_base + words[None, :] * stride_qk)
            else:
                packed = tl.load(q_base + words[None, :] * stride_qk, mask=words[None, :] < K // 8)
        if ROW_GROUPS:  # a group per row: act-order g_idx, or tiles that straddle groups
            k_safe = tl.minimum(ks, K - 1)
            if ACT_ORDER:
                g = tl.load(g_idx_ptr + k_safe)
            else:
                g = k_safe // GROUP_SIZE
            s = tl.load(s_base[:, None] + g[None, :] * stride_sg).to(tl.float32)
            if FP8_WEIGHT:
                w = values * s
            else:
                z = tl.load(z_base[:, None] + g[None, :] * stride_zg)
                w = codes_minus_zeros(packed, z, exponent, BLOCK_K) * s
        else:
            g = k0 // GROUP_SIZE
            s = tl.load(s_base + g * stride_sg).to(tl.float32)
            if FP8_WEIGHT:
                w = values
            else:
                z = tl.load(z_base + g * stride_zg)
                w = codes_minus_zeros(packed, z[:, None], exponent, BLOCK_K)
            if not SCALE_AFTER_DOT:
                w = w * s[:, None]
        w = w.to(xt.dtype)
        if DOT_UPCAST:  # interpreter only, see shard.platforms.cuda.kernels.dot_options
            w = w.to(tl.float32)
            xt = xt.to(tl.float32)
        if SCALE_AFTER_DOT:
            part = tl.dot(w, xt, input_precision=DOT_PRECISION)
            acc += part * s[:, None]
        else:
            acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION)

    out_mask = n_mask[:, None] & m_mask[None, :]
    o_ptrs = out_ptr + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None] * stride_on
    if SPLIT_K == 1:
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # partials: fp32 [SPLIT_K, M, N], contiguous. tl.cast, not M.to: the JIT passes an M of
        # 1 (one decode token) as a plain int constant, which has no .to.
        mn = tl.cast(M, tl.int64) * N
        p_offs = offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
        tl.store(partials_ptr + pid_k * mn + p_offs, acc, mask=out_mask)
        # Every thread's partial is written before one thread announces the arrival; the
        # acq_rel atomic makes them visible to the program that sees the last arrival (the
        # barrier-then-release pattern of CUTLASS's split-K semaphore).
        tl.debug_barrier()
        counter = counters_ptr + pid_m * tiles_n + pid_n
        arrived = tl.atomic_add(counter, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for split in range(SPLIT_K):
                # .cg: read at L2, where the other programs' writes are; L1 is not coherent.
                total += tl.load(
                    partials_ptr + split * mn + p_offs, mask=out_mask, cache_modifier=".cg"
                )
            tl.store(o_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(counter, 0)  # ready for the next launch


_counters: dict[torch.device, torch.Tensor] = {}


def _tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Split-K arrival counters, one per output tile, all 0 between launches (each tile's last
    arrival resets its own). Shared by every launch on the device, like a cuBLAS workspace:
    launches must not run concurrently on two streams (a shard runs one)."""
    buf = _counters.get(device)
    if buf is None or buf.numel() < tiles:
        buf = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device)
        _counters[device] = buf
    return buf


def _check_operands(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor | None,
    group_size: int,
) -> None:
    """The kernel trusts shapes and dtypes (a wrong one reads out of bounds): say it here."""
    k, (k_words, n) = x.shape[1], qweight.shape
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    if k != k_words * PACK:
        raise ValueError(f"x has {k} columns but qweight packs {k_words * PACK} rows")
    if qweight.dtype != torch.int32:
        raise ValueError(f"qweight must be int32, got {qweight.dtype}")
    if group_size <= 0 or group_size % PACK:
        raise ValueError(f"group_size {group_size} is not a positive multiple of {PACK}")
    groups = -(-k // group_size)
    if scales.dim() != 2 or scales.shape[1] != n or (g_idx is None and scales.shape[0] < groups):
        raise ValueError(f"scales {tuple(scales.shape)} do not cover {groups} groups x {n}")
    if not scales.dtype.is_floating_point:
        raise ValueError(f"scales must be floating point, got {scales.dtype}")
    if zeros.shape != scales.shape:
        raise ValueError(f"zeros {tuple(zeros.shape)} and scales {tuple(scales.shape)} differ")
    if zeros.dtype.is_floating_point or zeros.dtype == torch.bool:
        raise ValueError(f"zeros must be integer zero points, got {zeros.dtype}")
    if g_idx is not None and (g_idx.shape != (k,) or g_idx.dtype != torch.int32):
        raise ValueError(f"g_idx must be int32 [{k}], got {g_idx.dtype} {tuple(g_idx.shape)}")


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor | None,
    group_size: int,
    *,
    config: W4A16Config | None = None,
) -> torch.Tensor:
    """x [M, K] (fp16, bf16 or fp32) @ the int4 weight [K, N] -> [M, N] in x's dtype.

    qweight int32 [K // 8, N], scales [G, N] (any float dtype), zeros [G, N] (any integer
    dtype), g_idx int32 [K] or None, with the meaning of shard.layers.quant.int4. group_size
    must be a multiple of 8 (the per-tile group path needs a power-of-two factor of it as the
    K tile; other sizes take the per-row path).
    """
    _check_operands(x, qweight, scales, zeros, g_idx, group_size)
    tensors = [x, qweight, scales, zeros] + ([g_idx] if g_idx is not None else [])
    check_device(*tensors)
    return _launch(
        x, qweight, qweight.stride(), scales, scales.stride(), zeros, zeros.stride(), g_idx,
        group_size, qweight.shape[1], config, fp8=False,
    )  # fmt: skip


def fp8_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    block_k: int,
    *,
    config: W4A16Config | None = None,
) -> torch.Tensor:
    """x [M, K] (fp16, bf16 or fp32) @ weight.T -> [M, N] in x's dtype, for an FP8 weight
    [N, K] (float8_e4m3fn) whose [n, k] element is scaled by scales[n, k // block_k] (the
    internal form of shard.layers.quant.fp8): the same kernel, its FP8 variant."""
    m, k = x.shape
    n = weight.shape[0]
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(
            f"weight must be float8_e4m3fn [N, {k}], got {weight.dtype} {tuple(weight.shape)}"
        )
    if block_k <= 0 or scales.shape != (n, -(-k // block_k)):
        raise ValueError(
            f"scales {tuple(scales.shape)} do not hold one scale per {block_k} inputs of {n} "
            f"outputs x {k} inputs"
        )
    if not scales.dtype.is_floating_point:
        raise ValueError(f"scales must be floating point, got {scales.dtype}")
    check_device(x, weight, scales)
    # The kernel walks W^T: strides given as (along K, along N), as for the int4 layout.
    weight_strides = (weight.stride(1), weight.stride(0))
    scale_strides = (scales.stride(1), scales.stride(0))
    return _launch(
        x, weight, weight_strides, scales, scale_strides, scales, (0, 0), None, block_k, n,
        config, fp8=True,
    )  # fmt: skip


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_strides: tuple[int, int],
    scales: torch.Tensor,
    scale_strides: tuple[int, int],
    zeros: torch.Tensor,
    zero_strides: tuple[int, int],
    g_idx: torch.Tensor | None,
    group_size: int,
    n: int,
    config: W4A16Config | None,
    *,
    fp8: bool,
) -> torch.Tensor:
    """The kernel over checked operands; strides as (along K or groups, along N)."""
    m, k = x.shape
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    sms = num_sms(x.device)
    act_order = g_idx is not None
    if config is not None:  # default_config never picks a refused tile (test_w4a16.py)
        check_tile(config, compiled=not interpreting())
    cfg = config or default_config(m, n, group_size, x.dtype, sms, act_order)
    row_groups = act_order or group_size % cfg.block_k != 0
    tiles_m, tiles_n = triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n)
    k_tiles = triton.cdiv(k, cfg.block_k)
    split_k = cfg.split_k
    if split_k is None:
        split_k = choose_split_k(tiles_m * tiles_n, k_tiles, sms, m, k)
    # Splits of equal whole tile counts, none of them empty (an empty split would still arrive
    # and add a zero partial, for nothing).
    split_k = max(1, min(split_k, k_tiles))
    split_k = triton.cdiv(k_tiles, triton.cdiv(k_tiles, split_k))
    if split_k > 1:
        partials = torch.empty(split_k, m, n, dtype=torch.float32, device=x.device)
        counters = _tile_counters(x.device, tiles_m * tiles_n)
    else:
        partials = counters = out  # unused: the split-K epilogue is compiled out
    _w4a16_kernel[(tiles_m * tiles_n, split_k)](
        x,
        weight,
        scales,
        zeros,  # FP8: a dummy, never read
        g_idx if act_order else weight,  # a dummy when ACT_ORDER is off: never read
        out,
        partials,
        counters,
        m,
        n,
        k,
        *x.stride(),
        *weight_strides,
        *scale_strides,
        *zero_strides,
        *out.stride(),
        EXPONENT_2P23,
        GROUP_SIZE=group_size,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT_K=split_k,
        GROUP_M=8,
        ROW_GROUPS=row_groups,
        ACT_ORDER=act_order,
        SCALE_AFTER_DOT=cfg.scale_after_dot and not row_groups,
        EVEN_K=k % cfg.block_k == 0,
        FP8_WEIGHT=fp8,
        **dot_options(x.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
